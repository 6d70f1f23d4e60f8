"""The GPU-side waste one watched call finds (`lab.measure.waste`), on real tiny pipelines of the installed diffusers
(0.37.1): SD3.5's transposed activations and where they were made, Z-Image's mask that masks nothing, Lumina 2's
grouped-query attention by copies, FLUX.1 with nothing to report; the compiler's warnings and graph breaks; and a
whole-model compile that runs the forward its class holds at each call."""

import functools

import pytest
import torch

from lab.measure import waste
from lab.run.runner import _class_forward, timed_call
from lab.run.scenario import build, get_scenario


@functools.cache
def watched(name: str) -> dict:
    built = build(get_scenario(name), size="tiny", device="cpu")
    timed_call(built, seed=0, marks=False)
    return waste.watch_call(built, seed=0)


def sites(name: str, kind: str) -> list[dict]:
    return [s for s in watched(name)["sites"] if s["kind"] == kind]


def test_sd35_blocks_are_fed_the_patch_embeddings_transpose():
    blocks = sites("sd35", waste.STRIDED_BLOCK)
    assert blocks and all(s["detail"].startswith("JointTransformerBlock.hidden_states") for s in blocks)
    (block,) = blocks
    assert block["path"] == "diffusers/models/transformers/transformer_sd3.py" and block["function"] == "forward"
    assert block["count"] == 8  # 2 blocks x 4 steps
    # traced back to the line that made the layout: the patch embedding's flatten + transpose
    assert block["origin"].startswith("diffusers/models/embeddings.py:") and "(Tensor.transpose)" in block["origin"]
    norms = sites("sd35", waste.STRIDED_NORM)
    assert norms and {s["origin"] for s in norms} == {block["origin"]}
    (repeated,) = sites("sd35", waste.NO_REPEATED)
    assert "_repeated_blocks = ['JointTransformerBlock']" in repeated["detail"]


def test_zimage_attends_with_a_mask_that_masks_nothing():
    masks = sites("zimage", waste.MASK_NOTHING)
    assert masks and all(s["path"] == "diffusers/models/attention_dispatch.py" for s in masks)
    assert all(s["detail"].startswith("bool mask") for s in masks)
    assert not sites("zimage", waste.STRIDED_BLOCK)


def test_lumina2_repeats_its_keys_and_values_to_the_querys_heads():
    gqa = sites("lumina2", waste.GQA_COPIES)
    assert gqa and {s["path"] for s in gqa} == {"diffusers/models/transformers/transformer_lumina2.py"}
    assert {s["detail"].split()[0] for s in gqa} == {"key", "value"}


def test_flux_has_nothing_to_report():
    found = watched("flux")
    assert waste.summary(found) == {k: 0 for k in waste.KINDS}
    assert found["blocks"] == ["FluxSingleTransformerBlock", "FluxTransformerBlock"]
    assert found["attention"] and all(v["calls"] for v in found["attention"].values())


def test_the_compilers_graph_breaks_and_warnings_are_kept():
    @functools.lru_cache
    def cached(n):
        return n + 1

    def f(x):
        x = x * cached(2)
        print("a graph break")
        return x + 1

    compiled = torch.compile(f, backend="eager")
    found: dict = {}
    with waste.compiler_notes(found):
        compiled(torch.ones(3))
    assert found["graph_breaks"] and any("print" in reason or "builtin" in reason for reason in found["graph_breaks"])
    assert any("lru_cache" in text for text in found["warnings"])
    again: dict = {}
    with waste.compiler_notes(again):  # said again for the next pipeline, not once per process
        torch.compile(f, backend="eager")(torch.ones(4, 4))
    assert any("lru_cache" in text for text in again["warnings"])


class _Model(torch.nn.Module):
    def forward(self, x):
        return x + 1


def test_a_whole_model_compile_runs_the_forward_its_class_holds_at_each_call(monkeypatch):
    model = _Model()
    compiled = torch.compile(_class_forward(model), backend="eager")
    x = torch.zeros(2)
    assert torch.equal(compiled(x), x + 1)
    monkeypatch.setattr(_Model, "forward", lambda self, x: x + 2)  # a fix's arm swaps the class's forward
    assert torch.equal(compiled(x), x + 2)
    monkeypatch.undo()
    assert torch.equal(compiled(x), x + 1)


@pytest.mark.parametrize("name", ["wan"])
def test_wans_transpose_reaches_its_blocks_on_0371(name):
    (block,) = sites(name, waste.STRIDED_BLOCK)
    assert block["path"] == "diffusers/models/transformers/transformer_wan.py"
    assert block["origin"].startswith("diffusers/models/transformers/transformer_wan.py:")

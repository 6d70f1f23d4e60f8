"""`group_offload_keep_host` on the CPU, where group offloading moves nothing between devices.

Group offloading on a CPU onloads to and offloads to the same device, so no copy is ever made and the fix's saving
cannot show. The stand-in below makes the two moves real copies again, and nothing else: a move to the onload device
gives a new tensor, a move of such a tensor back gives a new host tensor (on a GPU, a blocking device-to-host copy),
and a move of a tensor already on the host gives the tensor itself, as `.to` does. Upstream's group offloading and the
fix's rewritten code and runtime part run for real on a tiny FLUX.1: outputs bit-identical, no parameter copied back,
the fixed path counted as run, and everything given back on exit. What it saves on a GPU is for `lab census` there.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from unittest import mock

import pytest
import torch

from lab.apply.fix import applied, each_sets, exercised, get_fix
from lab.apply.patching import CallCounter, offloading_groups
from lab.run.scenario import build, get_scenario
from tests.test_group_offload_stream import offload_with_a_stream, stand_ins

ONLOAD = {"_onload_from_memory", "_process_tensors_from_modules", "_transfer_tensor_to_device"}


@contextlib.contextmanager
def two_devices(moves: collections.Counter):
    """Count the copies group offloading would make between a device and its host, making each one for real."""
    real_to = torch.Tensor.to
    on_device: set[int] = set()  # data pointers of the tensors "on the device"
    alive: list[torch.Tensor] = []  # so that no pointer is reused by a later host tensor

    def phase() -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            # upstream's functions, and the fix's rewritten ones (compiled as "group_offloading.py [lab fix: ...]")
            if "hooks/group_offloading.py" in frame.f_code.co_filename:
                if frame.f_code.co_name == "_offload_to_memory":
                    return "offload"
                if frame.f_code.co_name in ONLOAD:
                    return "onload"
            frame = frame.f_back
        return None

    def to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        where = phase()
        if where == "onload" and self.data_ptr() not in on_device:
            out = out.clone()
            on_device.add(out.data_ptr())
            alive.append(out)
            moves["to the device"] += 1
        elif where == "offload" and self.data_ptr() in on_device:
            out = out.clone()
            alive.append(out)
            moves["back to the host"] += 1
        return out

    with mock.patch.object(torch.Tensor, "to", to):
        yield


def groups_of(pipe) -> list:
    return [group for _, group in offloading_groups(pipe)]


@pytest.fixture(scope="module")
def offloaded():
    """A tiny FLUX.1 with block-level group offloading without a stream (`enable_group_offload`'s default), and its
    output without offloading."""
    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    with stand_ins():
        built.pipe.transformer.enable_group_offload(onload_device=torch.device("cpu"),
                                                    offload_device=torch.device("cpu"),
                                                    offload_type="block_level", num_blocks_per_group=1)
    return built, reference


def test_the_weights_are_never_copied_back_and_everything_is_given_back(offloaded):
    built, reference = offloaded
    fix = get_fix("group_offload_keep_host")
    groups = groups_of(built.pipe)
    params = {id(p): p for g in groups for p in [*(p for m in g.modules for p in m.parameters()), *g.parameters]}
    buffers = {id(b) for g in groups for b in [*(b for m in g.modules for b in m.buffers()), *g.buffers]}
    assert groups and all(g.stream is None and g.cpu_param_dict == {} for g in groups)  # as upstream makes them

    unfixed: collections.Counter = collections.Counter()
    host = {i: p.data_ptr() for i, p in params.items()}
    originals = [p.data for p in params.values()]  # held, so that no new host tensor can take their addresses
    with stand_ins(), two_devices(unfixed):
        assert torch.equal(built().images, reference)
    transformer_calls = built.steps  # FLUX.1 has no CFG: one transformer call per step
    assert unfixed["to the device"] >= len(params) * transformer_calls
    assert unfixed["back to the host"] == unfixed["to the device"]  # every tensor copied there comes back
    assert all(p.data_ptr() != host[i] for i, p in params.items())  # the copies were real: new host tensors
    del originals

    fixed: collections.Counter = collections.Counter()
    counter = CallCounter()
    with stand_ins(), applied([fix], built.pipe, counter):
        kept = {id(p): t for g in groups for p, t in g.cpu_param_dict.items()}
        assert kept.keys() == params.keys()  # every parameter of every group, each once
        host = {i: t.data_ptr() for i, t in kept.items()}
        with two_devices(fixed):
            outputs = [built().images for _ in range(2)]
        assert all(p.data_ptr() == host[i] for i, p in params.items())  # pointed back at the very tensors kept
    assert all(torch.equal(out, reference) for out in outputs)
    assert fixed["to the device"] == unfixed["to the device"] * 2  # the onloads are as before
    assert fixed["back to the host"] == len(buffers) * 2 * transformer_calls  # only buffers are copied back
    assert exercised(fix, counter) == len(groups) * 2 * transformer_calls  # every offload took the new path

    assert all(g.cpu_param_dict == {} and "offload_" not in vars(g) for g in groups)  # given back
    again: collections.Counter = collections.Counter()
    with stand_ins(), two_devices(again):
        assert torch.equal(built().images, reference)
    assert again == unfixed  # upstream's copies, as before the fix


def test_it_runs_in_every_group_offloading_and_composes_with_the_pinned_top_level_group():
    """Without a stream, with one, and at leaf level: in `all` and `each` wherever group offloading is on, beside
    `group_offload_top_level` where that one runs (the two rewrite the same functions and compile together)."""
    from lab.apply.fix import _compiled

    def each(setting: str) -> set[str]:
        return {f.name for fixes, _ in each_sets("flux", [setting]) for f in fixes}

    for setting in ("group_offload (level=block_level, blocks=1, stream=False, record_stream=False)",
                    "group_offload (level=leaf_level, blocks=1, stream=True, record_stream=False)"):
        assert "group_offload_keep_host" in each(setting)
    assert "group_offload_keep_host" not in each("first_block_cache (threshold=0.2)")
    together = _compiled(("group_offload_keep_host", "group_offload_top_level"))
    assert {name for _, owner, name, _ in together if owner == "ModuleGroup"} >= {
        "_init_cpu_param_dict", "_offload_to_memory", "_onload_from_memory", "__init__"}


@pytest.mark.slow
def test_with_a_stream_and_both_fixes_the_top_level_group_takes_the_pinned_copies():
    """`--fix all` in group offloading with a stream switches both on: the top-level group, the only one without a
    stream, takes `group_offload_top_level`'s pinned copies (in either order of the two runtime parts), so this fix's
    path never runs there; outputs stay bit-identical."""
    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    offload_with_a_stream(built)
    keep, top = get_fix("group_offload_keep_host"), get_fix("group_offload_top_level")
    for fixes in ([keep, top], [top, keep]):
        counter = CallCounter()
        with stand_ins(), applied(fixes, built.pipe, counter):
            unstreamed = [g for g in groups_of(built.pipe) if g.stream is None]
            assert len(unstreamed) == 1 and unstreamed[0].pinned_copies
            assert torch.equal(built().images, reference)
        assert exercised(keep, counter) == 0 and exercised(top, counter) == built.steps


def tiny_flux_transformer():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                                  axes_dims_rope=[4, 4, 8])


def flux_inputs(dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, 16, 4, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=g).to(dtype),
                pooled_projections=torch.randn(1, 32, generator=g).to(dtype), timestep=torch.tensor([1.0], dtype=dtype),
                img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3), return_dict=False)


def group_offloaded(stream: bool):
    """The tiny transformer under block-level group offloading, with a (stand-in) stream or without, and a pipeline
    that holds it, as the fixes' runtime parts find one."""
    from types import SimpleNamespace

    from diffusers.hooks import group_offloading as go

    from tests.test_group_offload_stream import StandInStream

    model, cpu = tiny_flux_transformer(), torch.device("cpu")
    with stand_ins():
        go._apply_group_offloading(model, go.GroupOffloadingConfig(
            onload_device=cpu, offload_device=cpu, offload_type=go.GroupOffloadingType.BLOCK_LEVEL,
            non_blocking=stream, record_stream=False, low_cpu_mem_usage=False, num_blocks_per_group=1,
            stream=StandInStream() if stream else None))
    return model, SimpleNamespace(components={"transformer": model})


@pytest.mark.parametrize("stream, fixes", [
    (False, ("group_offload_keep_host",)),
    (True, ("group_offload_keep_host",)),
    (True, ("group_offload_top_level",)),
    (True, ("group_offload_keep_host", "group_offload_top_level")),
])
def test_a_model_cast_after_offloading_was_enabled_runs_in_its_new_dtype(stream, fixes):
    """`model.to(torch.bfloat16)` after `enable_group_offload(...)` gives every parameter a new host tensor; the kept
    tensors follow it (the top-level group's pinned copies too), so every later forward runs in bfloat16 with the
    same outputs as the model cast before offloading (unfixed, a stream's stale pinned copies bring float32 weights
    back: a dtype mismatch)."""
    expected = tiny_flux_transformer().to(torch.bfloat16)(**flux_inputs(torch.bfloat16))[0]
    model, pipe = group_offloaded(stream)
    counter = CallCounter()
    with stand_ins(), applied([get_fix(name) for name in fixes], pipe, counter):
        model(**flux_inputs(torch.float32))
        model.to(torch.bfloat16)
        outputs = [model(**flux_inputs(torch.bfloat16))[0] for _ in range(2)]
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(out, expected) for out in outputs)


def test_upstream_with_a_stream_brings_the_old_dtype_back_after_a_cast():
    """The fault the rule above mends in upstream's stream path too (diffusers 0.37.1 and 0.42.1 alike)."""
    model, _ = group_offloaded(stream=True)
    with stand_ins():
        model(**flux_inputs(torch.float32))
        model.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match="dtype"):
            model(**flux_inputs(torch.bfloat16))

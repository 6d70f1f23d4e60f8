"""The census fixes for reads a CPU trace cannot show: on a GPU each `nonzero`, `.tolist()` and `bool()` of a device
tensor waits for the device, on a CPU none of them is a host scalar read. Counted here at the Python level (a torch
function mode) on the tiny scenarios, with and without each fix; and the fixes' caches look afresh at a new mask, a
mask changed in place, and an inference-mode mask."""

import collections

import pytest
import torch
from torch.overrides import TorchFunctionMode

from lab.apply.fix import applied, get_fix
from lab.run.scenario import build, catalog, output_latents

READS = ("nonzero", "tolist", "item", "__bool__")


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def reads(built, **overrides):
    with CountReads() as mode:
        out = output_latents(built.pipe(**{**built.kwargs(), **overrides}))
    return dict(mode.counts), out


@pytest.mark.parametrize("pipeline, fix, before, after", [
    # 2 blocks x 2 samples (CFG in one batch) x 4 steps, and the scheduler's first-step index lookup (`nonzero`,
    # `.item()`: begin_index's); after: one per sample of the call's mask
    ("mochi", "mochi_prompt_tokens_once", {"nonzero": 17, "item": 1}, {"nonzero": 3, "item": 1}),
    # `prev_timestep >= 0` in every step (the alphas' index lookups are host scalar reads, which a CPU trace shows
    # too); after: one `.tolist()` before the loop
    ("cogvideox", "cogvideox_host_timestep", {"__bool__": 4}, {"tolist": 1}),
])
@pytest.mark.slow
def test_the_fix_removes_the_reads_of_the_loop(pipeline, fix, before, after):
    built = build(catalog()[pipeline], size="tiny", device="cpu")
    counted, reference = reads(built)
    with applied([get_fix(fix)], built.pipe):
        fixed, out = reads(built)
    assert torch.equal(out, reference)
    assert (counted, fixed) == (before, after)


def test_lumina2_reads_each_mask_once_per_call():
    """Without the fix every transformer call reads its mask's lengths. With it, a call with new masks (a user who
    passes text prompts) reads the prompt's and the negative prompt's once each, in the first step; the lab's repeated
    calls pass the same prompt mask, which stays read, and a negative mask that the pipeline makes anew: one per call."""
    built = build(catalog()["lumina2"], size="tiny", device="cpu")
    rope = built.pipe.transformer.rope_embedder
    forwards = []
    hook = rope.register_forward_pre_hook(lambda module, args: forwards.append(1))
    masks = {k: v for k, v in built.prompt_kwargs.items() if k.endswith("attention_mask")}
    assert len(masks) == 2
    try:
        unfixed, reference = reads(built)
        calls = len(forwards)
        with applied([get_fix("lumina2_caption_lengths_once")], built.pipe):
            fresh, out = reads(built, **{k: v.clone() for k, v in masks.items()})
            again, _ = reads(built)
            steady, _ = reads(built)
    finally:
        hook.remove()
    assert torch.equal(out, reference)
    assert calls >= 5 and unfixed["tolist"] == calls  # 4 steps with the prompt, the first also with the negative one
    assert fresh["tolist"] == 2 and again["tolist"] <= 2 and steady["tolist"] == 1


@pytest.mark.slow
def test_the_caches_look_afresh_at_a_new_changed_or_inference_mask():
    import diffusers.models.attention_processor as ap
    import diffusers.models.transformers.transformer_lumina2 as tl

    with applied([get_fix("mochi_prompt_tokens_once"), get_fix("lumina2_caption_lengths_once")], None):
        processor = ap.MochiAttnProcessor2_0()
        rope = tl.Lumina2RotaryPosEmbed(theta=10000, axes_dim=[4, 4, 4], axes_lens=[8, 8, 8], patch_size=2)
        mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
        first = processor._valid_prompt_tokens(mask)
        assert [t.tolist() for t in first] == [[0, 1], [0, 1, 2]] and rope._caption_lengths(mask) == [2, 3]
        assert ap.MochiAttnProcessor2_0()._valid_prompt_tokens(mask) is first  # shared by every layer's processor
        mask[0, 2] = 1  # changed in place: its version moves on
        assert [t.tolist() for t in processor._valid_prompt_tokens(mask)] == [[0, 1, 2], [0, 1, 2]]
        assert rope._caption_lengths(mask) == [3, 3]
        other = torch.tensor([[1, 0, 0, 0]])
        assert rope._caption_lengths(other) == [1] and rope._caption_lengths(mask) == [3, 3]  # both kept
        with torch.inference_mode():
            frozen = torch.tensor([[1, 1, 1, 1]])
            assert [t.tolist() for t in processor._valid_prompt_tokens(frozen)] == [[0, 1, 2, 3]]
            frozen[0, 3] = 0  # no version counter: never cached
            assert [t.tolist() for t in processor._valid_prompt_tokens(frozen)] == [[0, 1, 2]]
            assert rope._caption_lengths(frozen) == [3]


@pytest.mark.parametrize("pipeline, fix, read, after", [("mochi", "mochi_prompt_tokens_once", "nonzero", 3),
                                                     ("lumina2", "lumina2_caption_lengths_once", "tolist", 1)])
@pytest.mark.slow
def test_the_mask_caches_hold_under_compile_too(pipeline, fix, read, after):
    """Mochi and Lumina 2 name no repeated blocks, so the lab compiles their whole transformer (as a user must), and
    the attention processor's `nonzero` and the rope's `.tolist()` run inside the compiled graph, where the first forms
    of `mochi_prompt_tokens_once` and `lumina2_caption_lengths_once` stepped aside: on an H100 a compiled 2-block Mochi
    kept 14 of its syncs per call in the attention processor with every fix on
    (results/census/mochi__compile__full-2l-faster_cache__h100.md, first run). The helpers now run outside the graph
    (`torch.compiler.disable`, where the data-dependent read broke it anyway): compiled, each fix leaves what it
    leaves eager (Mochi 17 -> 3 `nonzero`, one per sample of the call's mask and the scheduler's first-step lookup;
    Lumina 2 5 -> 1 `.tolist()` once its masks are known), with the same outputs. Dynamo alone (`backend="eager"`)
    traces the model as Inductor would."""
    from lab.run.runner import CompileSpec, apply_compile

    torch._dynamo.reset()
    built = build(catalog()[pipeline], size="tiny", device="cpu")
    apply_compile(built, CompileSpec(mode="compile", backend="eager", regional=False))
    built()  # the first compiled call
    before, plain = reads(built)
    with applied([get_fix(fix)], built.pipe):
        reads(built)
        fixed, out = reads(built)
    assert torch.equal(out, plain)
    assert fixed[read] <= after < before[read], (before, fixed)
    torch._dynamo.reset()

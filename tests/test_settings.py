"""The settings users run (`--setting`, `lab.run.settings`): parsed and named on literal text, refused in one line
before anything is built, and on tiny pipelines on the CPU: turned on, seen in the trace, and undone exactly."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lab.base import naming
from lab.base.errors import UsageError
from lab.run import settings
from lab.run.profile import ProfileOptions, profile_call
from lab.run.scenario import build, get_scenario
from lab.traces.analysis import analyze
from lab.traces.trace import load
from tests.conftest import lab_here

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("text, tag, described", [
    ("first_block_cache", "first_block_cache", "first_block_cache (threshold=0.05)"),
    ("first_block_cache:threshold=0.2", "first_block_cache-threshold0.2", "first_block_cache (threshold=0.2)"),
    ("group_offload:leaf_level,stream", "group_offload-leaf_level-stream",
     "group_offload (level=leaf_level, blocks=1, stream=True, record_stream=False)"),
    ("group_offload:stream,record_stream", "group_offload-stream-record_stream",
     "group_offload (level=block_level, blocks=1, stream=True, record_stream=True)"),
    ("group_offload:blocks=2", "group_offload-blocks2", "group_offload (level=block_level, blocks=2, stream=False, record_stream=False)"),
    ("attention_backend:flex", "attention_backend-flex", "attention_backend (backend=flex)"),
    ("lora:rank=8,fused", "lora-rank8-fused", "lora (rank=8, scale=1.0, fused=True, seed=0)"),
    ("lora:fused=false", "lora", "lora (rank=16, scale=1.0, fused=False, seed=0)"),
    ("mag_cache", "mag_cache", "mag_cache (threshold=0.06, max_skip=3, retention=0.2, ratios=measured)"),
    ("mag_cache:flux,threshold=0.1", "mag_cache-threshold0.1-flux",
     "mag_cache (threshold=0.1, max_skip=3, retention=0.2, ratios=flux)"),
    ("quantized", "quantized", "quantized (type=int8wo)"),
    ("quantized:float8wo", "quantized-float8wo", "quantized (type=float8wo)"),
])
def test_a_setting_is_parsed_named_and_described(text, tag, described):
    s = settings.parse(text)
    assert s.tag() == tag and s.describe() == described


@pytest.mark.parametrize("texts, message", [
    (["first_block_cach"], "Unknown setting `first_block_cach`; choose one of first_block_cache,"),
    (["first_block_cache:treshold=0.2"], "`treshold` is not an option of `first_block_cache` (threshold=0.05)"),
    (["first_block_cache:threshold=high"], "`threshold` takes a float, not `high`"),
    (["group_offload:level=disk"], "`level` is one of block_level, leaf_level, not `disk`"),
    (["model_cpu_offload:fast"], "`fast` is not an option of `model_cpu_offload` (it takes none)"),
    (["first_block_cache", "taylorseer_cache"], "cannot be combined: diffusers takes one cache at a time"),
    (["mag_cache", "first_block_cache"], "cannot be combined: diffusers takes one cache at a time"),
    (["quantized:int4"], "`int4` is not an option of `quantized`"),
    (["model_cpu_offload", "group_offload"], "cannot be combined: diffusers takes one offloading at a time"),
])
def test_bad_settings_are_one_clear_error(texts, message):
    with pytest.raises(UsageError) as e:
        settings.parse_all(texts)
    assert message in str(e.value)


def test_the_setting_is_in_the_result_name():
    assert naming.size_tag("full", 4, settings=("first_block_cache-threshold0.2",)) == "full-4l-first_block_cache-threshold0.2"
    assert naming.size_tag("tiny", None, settings=("lora", "attention_backend-flex")) == "tiny-lora-attention_backend-flex"
    assert naming.size_tag("tiny", None) == "tiny"


@pytest.mark.parametrize("args, reason", [
    (["--pipeline", "flux2", "--setting", "first_block_cache"],
     "`--setting first_block_cache` cannot run on `flux2` (Flux2KleinPipeline) on cpu: diffusers has no block "
     "metadata for `Flux2TransformerBlock`"),
    (["--pipeline", "wan", "--setting", "group_offload:leaf_level"],
     "`--setting group_offload` cannot run on `wan` (WanPipeline) on cpu: on the CPU the weights already live"),
    (["--pipeline", "wan", "--setting", "attention_backend:flash"], "`--setting attention_backend` cannot run on `wan`"),
    (["--pipeline", "wan", "--setting", "mag_cache:ratios=flux"],
     "`--setting mag_cache` cannot run on `wan` (WanPipeline) on cpu: `ratios=flux` are FLUX.1's published ratios"),
    (["--pipeline", "flux2", "--setting", "mag_cache"], "no block metadata for `Flux2TransformerBlock`"),
    (["--pipeline", "sd35", "--setting", "first_block_cache"],
     "`--setting first_block_cache` cannot run on `sd35` (StableDiffusion3Pipeline) on cpu: SD3Transformer2DModel has "
     "no `enable_cache` (it is not a `CacheMixin`)"),
    (["--pipeline", "wan22", "--setting", "mag_cache"], "this pipeline hands its late steps to a second expert"),
    (["--pipeline", "wan", "--setting", "faster_cache"],
     "`--setting faster_cache` cannot run on `wan` (WanPipeline) on cpu: FasterCache keeps one state per hooked "
     "module, not one per guidance branch, and this pipeline calls the transformer once per branch"),
    (["--pipeline", "ltx2", "--setting", "faster_cache"], "its transformer returns a token sequence, not a latent grid"),
    (["--pipeline", "qwenimage", "--setting", "pyramid_attention_broadcast"],
     "`--setting pyramid_attention_broadcast` cannot run on `qwenimage` (QwenImagePipeline) on cpu: pyramid attention "
     "broadcast keeps one cache per hooked attention module, not one per guidance branch"),
    # the lab's environment has no torchao (tests/test_settings.py's quantized test brings its own)
    (["--pipeline", "wan", "--setting", "quantized"],
     "`--setting quantized` cannot run on `wan` (WanPipeline) on cpu: torchao is not installed (`pip install torchao`)"),
])
def test_a_setting_the_pipeline_or_device_cannot_take_is_refused_before_the_build(args, reason):
    proc = lab_here("run", *args)
    assert proc.returncode == 2 and reason in proc.stderr, proc.stderr
    assert "building" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _hooks(pipe) -> list[str]:
    """Every diffusers hook still registered on any module of the pipeline, and any PEFT adapter left."""
    found = []
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            for path, module in component.named_modules():
                registry = getattr(module, "_diffusers_hook", None)
                if registry is not None and registry.hooks:
                    found += [f"{name}.{path}: {h}" for h in registry.hooks]
                if getattr(module, "peft_config", None):
                    found.append(f"{name}.{path}: adapters {list(module.peft_config)}")
    return found


def _state(pipe) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v.detach().clone() for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)
            for k, v in c.state_dict().items()}


def _grads(pipe) -> dict[str, bool]:
    return {f"{name}.{k}": p.requires_grad for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)
            for k, p in c.named_parameters()}


CPU_SETTINGS = [("wan", "first_block_cache:threshold=0.2"), ("flux", "taylorseer_cache:interval=2"),
                ("qwenimage", "first_block_cache"), ("flux", "pyramid_attention_broadcast"),
                ("flux", "layerwise_casting"), ("qwenimage", "attention_backend:native"),
                ("flux", "lora:rank=4"), ("wan", "lora:rank=4,fused"), ("flux", "mag_cache:ratios=flux"),
                ("wan", "mag_cache:threshold=100"),
                # blocks that diffusers registers although the transformer names no `_repeated_blocks` (the check
                # finds them as diffusers' caches do)
                ("cogvideox", "first_block_cache:threshold=0.2"), ("mochi", "mag_cache"),
                # FasterCache guidance-distilled (no CFG) and with CFG run as one batch (the unconditional branch
                # approximated from the conditional one, the latents as B F C H W)
                ("flux", "faster_cache"), ("cogvideox", "faster_cache:uncond_skip_range=2"),
                ("sdxl", "lora:rank=4")]  # a UNet pipeline: the adapter goes on the denoiser, `unet`


@pytest.mark.parametrize("pipeline, text", CPU_SETTINGS)
def test_a_setting_runs_is_recorded_and_is_undone_exactly(pipeline, text):
    plain = build(get_scenario(pipeline), size="tiny", device="cpu")
    before, grads = _state(plain.pipe), _grads(plain.pipe)
    expected = plain().images if hasattr(plain(), "images") else None
    built = build(get_scenario(pipeline), size="tiny", device="cpu", settings=[text])
    assert built.settings == [settings.parse(text).describe()]
    assert built.setting_tags == (settings.parse(text).tag(),)
    first, second = built(), built()  # the same call twice: a cache decides again from the same data
    out = [getattr(o, "frames", None) if getattr(o, "frames", None) is not None else o.images for o in (first, second)]
    assert torch.equal(out[0], out[1]), "two calls of one arm in this setting differ"
    if not text.startswith(("attention_backend",)):
        assert _hooks(built.pipe) or text.startswith("lora:rank=4,fused"), "the setting left no trace on the pipeline"
    built.undo_settings()
    assert _hooks(built.pipe) == []
    after = _state(built.pipe)
    assert after.keys() == before.keys() and _grads(built.pipe) == grads
    assert all(torch.equal(after[k], before[k]) and after[k].dtype == before[k].dtype for k in before), \
        [k for k in before if not torch.equal(after[k], before[k])][:5]
    if expected is not None:
        assert torch.equal(built().images, expected)


def test_mag_cache_measures_this_pipelines_ratios_and_skips_by_them():
    """`ratios=measured`: one call in MagCache's calibration mode on the built pipeline gives one ratio per step
    (the first 1.0: no residual before it), and the cache then skips by them: with a threshold no error reaches,
    the output is not the plain pipeline's."""
    plain = build(get_scenario("wan"), size="tiny", device="cpu")
    reference = plain().frames
    built = build(get_scenario("wan"), size="tiny", device="cpu", settings=["mag_cache:threshold=100"])
    config = built.pipe.transformer._cache_config
    ratios = config.mag_ratios.tolist()
    assert len(ratios) == built.steps == config.num_inference_steps and ratios[0] == 1.0
    assert len(set(ratios)) > 1 and all(r > 0 for r in ratios)
    assert not torch.equal(built().frames, reference)
    built.undo_settings()
    assert torch.equal(built().frames, reference)


QUANTIZED = """
import json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from lab.run.scenario import build, get_scenario

def state(model):
    return {k: (v.dtype, v.detach().clone()) for k, v in model.state_dict().items()}

bf16 = build(get_scenario("wan"), size="tiny", device="cpu", dtype=torch.bfloat16)
expected = state(bf16.pipe.transformer)
kept = sorted(k for k, (dtype, _) in expected.items() if dtype == torch.float32)  # `_keep_in_fp32_modules`
for text in sys.argv[1:]:
    built = build(get_scenario("wan"), size="tiny", device="cpu", dtype=torch.bfloat16, settings=[text])
    model = built.pipe.transformer
    weights = {type(m.weight).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)}
    float32 = sorted(k for k, v in model.state_dict().items() if v.dtype == torch.float32)
    first, second = built().frames, built().frames
    on = dict(text=text, weights=sorted(weights), float32=float32, kept=len(kept), same=torch.equal(first, second),
              quantizer=type(model.hf_quantizer).__name__, finite=bool(torch.isfinite(first).all()))
    built.undo_settings()
    after = state(model)
    restored = after.keys() == expected.keys() and all(
        after[k][0] == expected[k][0] and torch.equal(after[k][1], expected[k][1]) for k in expected)
    print(json.dumps(dict(on, restored=restored, left=sorted(set(vars(model)) - set(vars(bf16.pipe.transformer))))))
"""


def test_quantized_is_a_torchao_load_of_the_denoiser_and_is_undone_exactly():
    """Through diffusers' own torchao quantizer, as `from_pretrained(..., quantization_config=TorchAoConfig(...))`
    loads it: every linear weight quantized, and nothing kept in float32 (Wan's float32 modules are bf16 in a torchao
    load); the same call twice gives the same output; the undo gives back the bf16 model as built, bit for bit. In a
    process of its own with torchao on its path (`make` installs it in `.venv/torchao`, outside the lab's own
    environment, where every diffusers import would print torchao's noise)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import ROOT

    torchao = Path(sys.prefix) / "torchao"
    if not (torchao / "torchao").is_dir():
        pytest.fail(f"no torchao in {torchao}: `make test` installs it there")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(torchao), str(ROOT)])}
    expected = {"quantized": "Int8Tensor", "quantized:float8wo": "Float8Tensor"}
    proc = subprocess.run([sys.executable, "-c", QUANTIZED, *expected], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # one process for both: its imports are most of its time
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [got["text"] for got in lines] == list(expected), proc.stdout[-3000:]
    for got in lines:
        assert got["weights"] == [expected[got["text"]]] and got["quantizer"] == "TorchAoHfQuantizer", got
        assert got["kept"] > 0 and got["float32"] == [] and got["same"] and got["finite"], got
        assert got["restored"] and got["left"] == [], got


def test_a_cache_that_hooks_nothing_is_refused_before_the_build_not_run_silently():
    """TaylorSeer's default identifiers (`^blocks.*attn`, matched whole) match no module of Wan (`blocks.0.attn1`):
    diffusers turns the cache on and it does nothing. The lab tries it on the transformer made on the meta device
    and says so before building."""
    proc = lab_here("run", "--pipeline", "wan", "--setting", "taylorseer_cache")
    assert proc.returncode == 2 and "building" not in proc.stderr, proc.stderr
    assert "`--setting taylorseer_cache` cannot run on `wan` (WanPipeline) on cpu: `TaylorSeerCacheConfig` hooks no " \
           "module of WanTransformer3DModel" in proc.stderr
    assert lab_here("run", "--pipeline", "flux", "--setting", "taylorseer_cache", "--steps", "1").returncode == 0


def _scalar_reads(built, tmp_path, stem) -> int:
    paths = profile_call(built, tmp_path, stem, ProfileOptions(with_stack=False))
    return analyze(load(paths["trace"]))["host_reads"]["scalar_reads"]


def test_the_first_block_cache_shows_as_host_reads_in_the_trace(tmp_path):
    """The cache compares the first block's residual with the last step's on the host in every forward after the
    first: host scalar reads that the plain pipeline does not have (a sync per forward on a GPU)."""
    plain = _scalar_reads(build(get_scenario("qwenimage"), size="tiny", device="cpu"), tmp_path, "plain")
    cached = build(get_scenario("qwenimage"), size="tiny", device="cpu", settings=["first_block_cache:threshold=0.2"])
    assert _scalar_reads(cached, tmp_path, "cached") >= plain + 6


def test_a_caches_decisions_are_counted_for_the_block_and_the_hook_given_back():
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    from lab.run.settings import decisions

    decide = FBCHeadBlockHook.__dict__["_should_compute_remaining_blocks"]
    built = build(get_scenario("flux"), size="tiny", device="cpu", settings=["first_block_cache:threshold=10"])
    with decisions(built.chosen_settings) as decided:
        built()
    assert decided == {"decided by first_block_cache: computed": 1, "decided by first_block_cache: skipped": 3}
    assert FBCHeadBlockHook.__dict__["_should_compute_remaining_blocks"] is decide
    with decisions(built.chosen_settings) as again, decisions([settings.parse("lora:rank=4")]) as none:
        built()
    assert again == decided and none == {}  # a setting that decides nothing from the data counts nothing
    built.undo_settings()


def test_ab_in_a_setting_records_it_and_names_it(tmp_path):
    from lab.pages import table

    proc = lab_here("ab", "--fix", "no_progress_bar", "--pipeline", "qwenimage", "--setting", "first_block_cache",
                    "--blocks", "1", "--repeat", "1", "--no-profile", "--out", str(tmp_path / "ab"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = tmp_path / "ab" / "qwenimage" / "no_progress_bar__eager__tiny-first_block_cache__cpu.json"
    result = json.loads(path.read_text())
    assert result["settings"] == ["first_block_cache (threshold=0.05)"]
    assert "· setting first_block_cache (threshold=0.05) ·" in path.with_suffix(".md").read_text()
    # the cache's decisions in each arm's verifying call: one per transformer call (4 steps, true CFG: 8), the same
    # in both arms (the fix does not touch the cache)
    decided = result["verify"]["decisions"]
    assert set(decided) == {"control", "test"} and decided["control"] == decided["test"]
    assert sum(decided["control"].values()) == 8 and set(decided["control"]) == {
        "first_block_cache: computed", "first_block_cache: skipped"}
    # the docs table keeps results in different settings in sections of their own
    assert ", 4 steps, setting first_block_cache (threshold=0.05)\n" in table.generate(tmp_path)


def test_pab_in_a_pipeline_that_calls_the_transformer_per_branch_gives_the_unconditional_call_the_conditional_attention():
    """Why the lab refuses pyramid attention broadcast where guidance runs one transformer call per branch: upstream's
    hook keeps one cache per attention module, so on Wan (turned on through diffusers' own API, as a user does) every
    unconditional call inside the timestep range returns the attention output the conditional call of the same step
    cached, and no conditional call ever reuses anything."""
    import contextlib

    from diffusers import PyramidAttentionBroadcastConfig
    from diffusers.hooks.pyramid_attention_broadcast import PyramidAttentionBroadcastHook

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    transformer, branch, seen = built.pipe.transformer, {"now": None}, []
    enter, forward = type(transformer).cache_context, PyramidAttentionBroadcastHook.new_forward

    @contextlib.contextmanager
    def cache_context(self, name):
        branch["now"] = name
        with enter(self, name):
            yield

    def new_forward(hook, module, *args, **kwargs):
        cached, cached_by = hook.state.cache, getattr(hook.state, "cached_by", None)
        output = forward(hook, module, *args, **kwargs)
        seen.append((branch["now"], cached_by if cached is not None and output is cached else None))
        hook.state.cached_by = branch["now"]
        return output

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(transformer), "cache_context", cache_context)
        mp.setattr(PyramidAttentionBroadcastHook, "new_forward", new_forward)  # before the hooks bind it
        transformer.enable_cache(PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, current_timestep_callback=lambda: built.pipe.current_timestep))
        try:
            built()
        finally:
            transformer.disable_cache()
    reused = [(now, by) for now, by in seen if by is not None]
    assert reused and all(pair == ("uncond", "cond") for pair in reused), seen
    assert not any(now == "cond" and by for now, by in seen)


def test_the_pab_fix_reaches_hooks_registered_before_it_and_leaves_them_as_they_were(tmp_path):
    """Pyramid attention broadcast compares the timestep in every hooked attention call; `pab_timestep_once`
    compares once per step. The setting registers its hooks at the build, before the fix is switched on: the fix
    still reaches them, and on exit they run the method they had."""
    from lab.apply.fix import applied, get_fix

    built = build(get_scenario("flux"), size="tiny", device="cpu", settings=["pyramid_attention_broadcast"])
    before = _scalar_reads(built, tmp_path, "before")
    plain = built().images
    with applied([get_fix("pab_timestep_once")], built.pipe):
        fixed = _scalar_reads(built, tmp_path, "fixed")
        assert torch.equal(built().images, plain)
    assert fixed <= built.steps < before, (before, fixed)  # at most one read per step
    assert _scalar_reads(built, tmp_path, "after") == before


@pytest.mark.parametrize("setting, fix, per_step", [("pyramid_attention_broadcast", "pab_timestep_once", 1),
                                                     ("faster_cache", "faster_cache_timestep_once", 2)])
def test_the_timestep_fixes_read_once_per_step_under_regional_compile_too(tmp_path, setting, fix, per_step):
    """The cache hooks on the attention modules run inside the compiled blocks, where a cache of a Python value kept
    across calls cannot live in the graph: the fixes' comparison runs outside it (`torch.compiler.disable`, a graph
    break where the data-dependent branch made one anyway), so compiled they leave what they leave eager on FLUX.1
    (PAB: one read per step; FasterCache: 8 reads per call, 24 without the fix). On an H100 the first form of
    `pab_timestep_once` stepped aside under compile and left all 407 syncs per FLUX.1 call. Dynamo alone
    (`backend="eager"`) traces the hooks as Inductor would, without a C compiler."""
    from lab.apply.fix import applied, get_fix
    from lab.run.runner import CompileSpec, apply_compile

    torch._dynamo.reset()
    built = build(get_scenario("flux"), size="tiny", device="cpu", settings=[setting])
    apply_compile(built, CompileSpec(mode="compile", backend="eager"))
    built()  # the first compiled call
    before = _scalar_reads(built, tmp_path, "before")
    plain = built().images
    with applied([get_fix(fix)], built.pipe):
        built()
        fixed = _scalar_reads(built, tmp_path, "fixed")
        assert torch.equal(built().images, plain)
    assert fixed <= per_step * built.steps < before, (before, fixed)
    torch._dynamo.reset()


@pytest.mark.parametrize("pipeline", ["flux", "cogvideox"])
def test_the_faster_cache_fix_reads_the_timestep_once_per_step_and_range(tmp_path, pipeline):
    """FasterCache compares the timestep with its ranges in the denoiser hook, in every hooked attention call and (with
    CFG as one batch, CogVideoX) in its two frequency-weight callbacks: `faster_cache_timestep_once` copies the
    timestep to the host once per step and answers each range once. The hooks and callbacks exist before the fix is
    switched on; the fix reaches them all, and on exit they are as they were."""
    from lab.apply.fix import applied, exercised, get_fix
    from lab.apply.patching import CallCounter

    plain = _scalar_reads(build(get_scenario(pipeline), size="tiny", device="cpu"), tmp_path, "plain")
    built = build(get_scenario(pipeline), size="tiny", device="cpu", settings=["faster_cache"])
    before = _scalar_reads(built, tmp_path, "before")
    ranges = 4 if built.guidance().kind == "batched" else 2  # uncond and attention (+ 2 weights)
    out = built()
    reference = out.frames if getattr(out, "frames", None) is not None else out.images
    counter = CallCounter()
    with applied([get_fix("faster_cache_timestep_once")], built.pipe, counter):
        fixed = _scalar_reads(built, tmp_path, "fixed")
        out = built()
        assert torch.equal(out.frames if getattr(out, "frames", None) is not None else out.images, reference)
    assert plain < fixed <= plain + ranges * built.steps < before, (plain, fixed, before)  # at most one per range
    assert exercised(get_fix("faster_cache_timestep_once"), counter) > 0
    assert _scalar_reads(built, tmp_path, "after") == before


class CopiesToDevice(TorchDispatchMode):
    """Counts the copies of a host tensor to another device (on a meta tensor, the copies a GPU would make)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" and out.device.type != "cpu":
            self.copies += 1
        return out


def test_the_faster_cache_mask_fix_splits_without_a_copy_and_composes_with_the_timestep_fix():
    """FasterCache's frequency split builds its mask on the host and copies it to the states' device in every call
    (5 to 7 syncs per call in the GPU census): with `faster_cache_freq_mask_device` the mask is made on that device
    (meta here stands in for the GPU: no copy from the host), the split is bit-identical, and on the tiny CogVideoX
    (CFG as one batch) the fixed split runs, with the timestep fix, and gives the same frames."""
    import diffusers.hooks.faster_cache as faster_cache
    from lab.apply.fix import applied, exercised, get_fix
    from lab.apply.patching import CallCounter

    x = torch.randn(2, 3, 12, 10, generator=torch.Generator().manual_seed(0))
    on_meta = x.to("meta")
    upstream = faster_cache._split_low_high_freq
    with CopiesToDevice() as mode:
        upstream(on_meta)
    assert mode.copies == 1
    built = build(get_scenario("cogvideox"), size="tiny", device="cpu", settings=["faster_cache"])
    reference = built().frames
    counter = CallCounter()
    fixes = [get_fix("faster_cache_freq_mask_device"), get_fix("faster_cache_timestep_once")]
    with applied(fixes, built.pipe, counter):
        fixed = faster_cache._split_low_high_freq
        assert fixed is not upstream
        with CopiesToDevice() as mode:
            fixed(on_meta)
        assert mode.copies == 0
        assert all(torch.equal(a, b) for a, b in zip(fixed(x), upstream(x)))
        assert torch.equal(built().frames, reference)
    assert exercised(fixes[0], counter) > 0 and exercised(fixes[1], counter) > 0
    assert faster_cache._split_low_high_freq is upstream


def test_a_fix_in_a_settings_hooks_is_left_out_of_all_and_each_without_that_setting():
    from lab.apply.fix import each_sets

    proc = lab_here("ab", "--fix", "pab_timestep_once", "--pipeline", "flux")
    assert proc.returncode == 2 and "only runs with `--setting pyramid_attention_broadcast`" in proc.stderr
    plain = {f.name for fixes, _ in each_sets("flux") for f in fixes}
    in_setting = {f.name for fixes, _ in each_sets("flux", ("pyramid_attention_broadcast",)) for f in fixes}
    assert "pab_timestep_once" not in plain and in_setting == plain | {"pab_timestep_once"}


def test_a_fix_that_needs_a_settings_options_runs_only_where_they_are_on():
    """group_offload_top_level's code runs only in block-level group offloading with a stream: without the stream,
    or at leaf level, the setting is on but the fix's code never runs, so `each` and `all` leave it out."""
    from lab.apply.fix import each_sets

    def each(spec):
        return {f.name for fixes, _ in each_sets("flux", (settings.parse(spec).describe(),)) for f in fixes}

    assert "group_offload_top_level" in each("group_offload:block_level,stream")
    assert "group_offload_top_level" in each("group_offload:block_level,stream,record_stream")
    assert "group_offload_top_level" not in each("group_offload:block_level")
    assert "group_offload_top_level" not in each("group_offload:leaf_level,stream")
    proc = lab_here("ab", "--fix", "group_offload_top_level", "--pipeline", "flux", "--setting", "group_offload")
    assert proc.returncode == 2 and "only runs with `--setting group_offload:block_level,stream`" in proc.stderr


def test_record_stream_needs_the_side_stream():
    from diffusers import WanPipeline, WanTransformer3DModel

    target = settings.Target(WanPipeline, WanTransformer3DModel)
    with pytest.raises(UsageError, match="cannot run on `wan` .*on cuda: `record_stream` .* needs `stream`"):
        settings.check([settings.parse("group_offload:record_stream")], "wan", target, "cuda")
    settings.check([settings.parse("group_offload:stream,record_stream")], "wan", target, "cuda")  # taken


def test_a_backend_that_takes_no_mask_is_refused_where_the_transformer_gives_its_attention_one():
    """LTX-2's transformer gives its attention a mask (read off the tiny call that reads guidance), and PyTorch's
    flash kernel (`_native_flash`) raises on one at the first attention call in diffusers 0.37.1 (its message names
    another backend): refused before anything is built. FLUX.1 gives none, and takes it; the native backend takes
    masks."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    from lab.run import scenario
    from lab.run.settings import masks_refused

    assert masks_refused(AttentionBackendName.NATIVE) is None
    assert masks_refused(AttentionBackendName._NATIVE_FLASH) == "`attn_mask` is not supported for aiter attention"
    assert masks_refused(AttentionBackendName.SAGE) == "`attn_mask` is not supported for sage attention"
    assert scenario.attention_mask_of(get_scenario("ltx2")) is True
    assert scenario.attention_mask_of(get_scenario("flux")) is False
    refused = lab_here("ab", "--pipeline", "ltx2", "--fix", "begin_index", "--setting",
                       "attention_backend:_native_flash")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "ERROR: `--setting attention_backend` cannot run on `ltx2` (LTX2Pipeline) on cpu: its transformer's attention "
        "is given a mask, which the `_native_flash` backend does not take (diffusers raises \"`attn_mask` is not "
        "supported for aiter attention\" at the first attention call).")
    from lab.run.scenario import setting_target

    flux = setting_target(get_scenario("flux"))
    settings.check([settings.parse("attention_backend:_native_flash")], "flux", flux, "cpu")  # taken


@pytest.mark.parametrize("pipeline, kind, layout", [("flux", "none", None), ("wan", "separate", None),
                                                    ("cogvideox", "batched", "BFCHW"), ("mochi", "batched", "BCFHW")])
def test_how_a_pipeline_runs_guidance_is_read_off_its_tiny_build_leaving_the_process_as_it_was(pipeline, kind, layout):
    """FasterCache's mode depends on it: one denoiser call per step or two, one batch or two, and where the latent
    channels sit. The probe builds and calls the tiny pipeline on the CPU without touching the random state or the
    thread count of the run that asked (which then builds its own pipeline, at any size)."""
    from lab.run import scenario

    scenario._GUIDANCE.pop(pipeline, None)
    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    guidance = scenario.guidance_of(get_scenario(pipeline))
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), state)
    assert guidance.kind == kind and (layout is None or guidance.layout == layout), guidance
    assert guidance.calls_per_step == (2 if kind == "separate" else 1)


def test_the_cache_probe_keeps_diffusers_warnings_for_the_real_apply(capfd):
    """The check turns FasterCache on over a meta-device transformer; diffusers' "purely experimental" warning is the
    real apply's to give once, not the probe's (a campaign checks every cell: it came three times per command)."""
    from diffusers.utils import logging as diffusers_logging

    from lab.run.scenario import setting_target

    before = diffusers_logging.get_verbosity()
    assert settings.refusal(settings.parse("faster_cache"), setting_target(get_scenario("flux")), "cpu") is None
    assert "purely experimental" not in capfd.readouterr().err
    assert diffusers_logging.get_verbosity() == before

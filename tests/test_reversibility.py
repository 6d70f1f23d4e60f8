"""Leaving `applied(...)`, normally or by exception, puts back exactly the original objects."""

import importlib
import inspect

import pytest

from lab.apply.fix import applied, catalog
from lab.run.scenario import build, get_scenario


def snapshot(fix, pipe):
    """Every attribute a fix can touch: module and class dicts of its rewrite targets, the pipe and its scheduler."""
    state = {}
    for r in fix.rewrites:
        try:
            module = importlib.import_module(r.module)
        except ImportError:
            continue
        state[r.module] = dict(vars(module))
        for target in r.targets:
            owner = getattr(module, target.split(".")[0], None)
            if isinstance(owner, type):
                state[f"{r.module}:{owner.__name__}"] = dict(vars(owner))
                method = vars(owner).get(target.split(".")[1])
                if method is not None:
                    func = getattr(method, "__func__", method)
                    state[f"sig:{target}"] = inspect.signature(func)
    state["pipe"] = dict(vars(pipe))
    state["scheduler_cls"] = dict(vars(type(pipe.scheduler)))
    from accelerate.hooks import CpuOffload  # a runtime patch of accelerate's hook (`model_offload_keep_host`)

    state["accelerate:CpuOffload"] = dict(vars(CpuOffload))
    return state


def same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        if key.startswith("sig:"):
            assert before[key] == after[key], key
        else:
            assert before[key].keys() == after[key].keys(), key
            for name, value in before[key].items():
                if key == "pipe" and not callable(value) and not hasattr(value, "config"):
                    # per-call state the pipeline itself resets on every call (`_guidance_scale`, ...): by value
                    assert after[key][name] == value, f"{key}.{name} was not restored"
                    continue
                assert after[key][name] is value, f"{key}.{name} was not restored"


PIPES = {"begin_index": "wan", "flux2_unpack_hw": "flux2", "hook_registry_cache": "flux", "no_progress_bar": "wan",
         "qwen_modulate_index": "qwenimage_zero_cond", "qwen_rope_device": "qwenimage", "unipc_device_const": "wan",
         "unipc_stack": "wan", "unipc_host_coeffs": "wan", "transformer_dtype": "flux2", "pab_timestep_once": "flux",
         "zimage_t_norm": "zimage", "zimage_pad_where": "zimage", "chroma_guidance_device": "chroma",
         "wan_boundary_once": "wan22", "auraflow_timestep_device": "auraflow", "lumina2_rope_device": "lumina2",
         "cogvideox_host_timestep": "cogvideox", "mochi_prompt_tokens_once": "mochi",
         "lumina2_caption_lengths_once": "lumina2", "group_offload_top_level": "flux",
         "group_offload_keep_host": "flux", "model_offload_keep_host": "flux", "model_offload_pinned": "flux",
         "sequential_offload_pinned": "flux", "sequential_offload_keep_cache": "flux",
         "first_block_cache_lagged": "flux",
         "faster_cache_timestep_once": "flux", "faster_cache_freq_mask_device": "cogvideox"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(catalog()))
def test_restored_after_normal_exit_and_exception(name):
    fix = catalog()[name]
    # the fix's first pipeline, unless one is named above (a fix of every pipeline, or a setting's, needs one)
    built = build(get_scenario(PIPES.get(name) or fix.pipelines[0]), size="tiny", device="cpu")
    built()  # a call sets the pipeline's own per-call attributes; snapshot after it
    before = snapshot(fix, built.pipe)
    with applied([fix], built.pipe):
        built()
    same(before, snapshot(fix, built.pipe))
    with pytest.raises(RuntimeError, match="boom"):
        with applied([fix], built.pipe):
            raise RuntimeError("boom")
    same(before, snapshot(fix, built.pipe))


def test_every_fix_has_a_pipeline_to_be_tested_on():
    assert set(PIPES) <= set(catalog()), "a pipeline named for a fix the catalog no longer has"
    for name, fix in catalog().items():
        assert name in PIPES or (fix.pipelines and fix.pipelines[0] != "*"), f"name a pipeline for {name} above"

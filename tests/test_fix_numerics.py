"""Each fix leaves the numbers unchanged (CPU), and the patched code is what runs."""

import pytest
import torch
from diffusers import FluxTransformer2DModel, UniPCMultistepScheduler
from diffusers.hooks import FirstBlockCacheConfig

from lab.apply import rewrite
from lab.apply.fix import applied, get_fix
from lab.apply.patching import CallCounter, Patcher
from tests.conftest import upstream_source


def unipc_run(steps: int = 6) -> torch.Tensor:
    """UniPC in flow mode (Wan's setting) stepped `steps` times on fixed random residuals: order-2 paths run."""
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(steps)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 3, 8, 8, generator=g)
    for t in scheduler.timesteps:
        residual = torch.randn(sample.shape, generator=g)
        sample = scheduler.step(residual, t, sample).prev_sample
    return sample


@pytest.mark.parametrize("names", [("unipc_stack",), ("unipc_device_const",), ("unipc_stack", "unipc_device_const"),
                                   ("unipc_host_coeffs",)])
def test_unipc_fixes_are_bit_identical(names):
    reference = unipc_run()
    counter = CallCounter()
    with applied([get_fix(n) for n in names], counter=counter):
        fixed = unipc_run()
    assert torch.equal(reference, fixed)
    assert counter.counts["UniPCMultistepScheduler.multistep_uni_p_bh_update"] == 6
    assert counter.counts["UniPCMultistepScheduler.multistep_uni_c_bh_update"] == 5


def tiny_flux() -> FluxTransformer2DModel:
    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
    ).eval()


def flux_inputs():
    g = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, 16, 4, generator=g), "encoder_hidden_states": torch.randn(1, 8, 32, generator=g),
        "pooled_projections": torch.randn(1, 32, generator=g), "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(16, 3), "txt_ids": torch.zeros(8, 3), "return_dict": False,
    }


def cache_sequence(model) -> list[torch.Tensor]:
    """The #14037 sequence: a cache_context before any cache hook, then enable_cache, use, disable, use."""
    outs = []
    with torch.no_grad():
        with model.cache_context("cond"):
            outs.append(model(**flux_inputs())[0])
        model.enable_cache(FirstBlockCacheConfig(threshold=0.2))
        for _ in range(2):
            with model.cache_context("cond"):
                outs.append(model(**flux_inputs())[0])
        model.disable_cache()
        with model.cache_context("cond"):
            outs.append(model(**flux_inputs())[0])
    return outs


def test_hook_cache_survives_enable_cache_after_first_context():
    reference = cache_sequence(tiny_flux())
    counter = CallCounter()
    with applied([get_fix("hook_registry_cache")], counter=counter):
        fixed = cache_sequence(tiny_flux())
    assert all(torch.equal(a, b) for a, b in zip(reference, fixed))
    assert counter.counts["HookRegistry._get_child_registries"] > 0


def test_the_same_sequence_fails_on_upstream_0380_cache():
    """The test above can fail: with 0.38.0's never-invalidated cache, #14037's error comes back."""
    import diffusers.hooks.hooks as hooks

    source = upstream_source("0.38.0", "diffusers.hooks.hooks")
    with Patcher() as patcher:
        for (owner, name), value in rewrite.compile_definitions(hooks, source, "<0.38.0 hooks>").items():
            patcher.setattr(getattr(hooks, owner) if owner else hooks, name, value)
        with pytest.raises(ValueError, match="No context is set"):
            cache_sequence(tiny_flux())


def test_conflicting_fixes_are_refused_or_skipped():
    from lab.apply.fix import catalog, check_fixes_for
    from lab.base.errors import UsageError

    with pytest.raises(UsageError, match="cannot be applied together"):
        check_fixes_for("wan", [get_fix("unipc_host_coeffs"), get_fix("unipc_stack")], skip_inapplicable=False)
    keep, notes = check_fixes_for("wan", list(catalog().values()), skip_inapplicable=True)
    names = [f.name for f in keep]
    assert "unipc_host_coeffs" in names and "unipc_stack" not in names
    assert any("unipc_stack" in n and "cannot be applied together" in n for n in notes)
    # what `--fix all` applies to a Wan run composes without refusals: its rewrites (as a run of Wan compiles them,
    # not the 47 other pipelines begin_index reaches) and its runtime patches on the pipeline
    from lab.run.scenario import build, get_scenario

    pipe = build(get_scenario("wan"), size="tiny", device="cpu").pipe
    with applied(keep, pipe=pipe):
        unipc_run()

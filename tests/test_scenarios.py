"""Every tiny scenario runs end to end on CPU, with and without each applicable fix; sizes and bad input."""


import pytest
import torch

from lab.apply.fix import applied, check_fixes_for
from lab.apply.fix import catalog as fixes
from lab.run.scenario import build, catalog, estimate, output_latents
from tests.conftest import lab_here

# latent output shapes at tiny size, as each real pipeline gives them for output_type="latent"
SHAPES = {
    "flux": (1, 16, 4),  # packed: (8/2)*(8/2) tokens x 4 channels
    "flux2": (1, 1, 8, 8),  # Klein unpacks and unpatchifies: [B, C, H, W]
    "wan": (1, 16, 3, 2, 2),  # [B, C, (9-1)/4+1 frames, 16/8, 16/8]
    "wan_v2v": (1, 16, 3, 2, 2),  # the 9-frame input video encoded
    "ltx2": (1, 4, 5, 16, 16),
    "ltx2_i2v": (1, 4, 5, 16, 16),
    "qwenimage": (1, 16, 16),
    "qwenimage_zero_cond": (1, 16, 16),
    "sdxl": (1, 4, 8, 8),
    "sd35": (1, 4, 16, 16),
    "flux_kontext": (1, 4, 4),  # packed, as flux
    "chroma": (1, 16, 4),
    "qwenimage_edit": (1, 4, 16),
    "hunyuan_video": (1, 4, 3, 2, 2),
    "zimage": (1, 16, 16, 16),
    "cosmos2": (1, 16, 4, 4),
    "wan22": (1, 16, 3, 2, 2),
    "cogvideox": (1, 3, 4, 2, 2),  # [B, frames, C, H, W]
    "mochi": (1, 12, 2, 2, 2),
    "lumina2": (1, 4, 4, 4),
    "auraflow": (1, 4, 16, 16),
    "sana": (1, 4, 16, 16),
}
#: scenarios whose models need a package the CPU machine cannot install (the GPU machine has it)
NEEDS = {"cosmos2": "torchvision"}  # CosmosTransformer3DModel resizes its padding mask with torchvision


def test_every_scenario_is_covered():
    assert set(SHAPES) == set(catalog())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_tiny_scenario_with_and_without_each_fix(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{name} needs {NEEDS[name]}, which the CPU build of torch here lacks")
    built = build(catalog()[name], size="tiny", device="cpu")
    reference = output_latents(built())
    assert tuple(reference.shape) == SHAPES[name]
    assert torch.isfinite(reference).all()
    applicable, _ = check_fixes_for(name, list(fixes().values()), skip_inapplicable=True)
    assert applicable, f"no fix applies to {name}"
    for fix in applicable:
        with applied([fix], built.pipe):
            out = output_latents(built())
        assert torch.equal(out, reference), f"{fix.name} changed the output of {name}"


def test_video_to_video_begins_where_strength_puts_it():
    """Wan video-to-video starts the schedule part-way: the rewritten call must set that index, not 0 (a wrong index
    would change the output, which the parametrized test above compares bit for bit)."""
    from lab.apply.fix import get_fix
    from lab.apply.patching import CallCounter

    built = build(catalog()["wan_v2v"], size="tiny", device="cpu")
    counter = CallCounter()
    with applied([get_fix("begin_index")], built.pipe, counter):
        built()
        assert built.pipe.scheduler.begin_index == 1  # strength 0.8 of 4 steps: the last 3 steps, from index 1
    assert counter.counts["WanVideoToVideoPipeline.__call__"] == 1


def test_pretrained_loading_round_trip(tmp_path):
    built = build(catalog()["wan"], size="tiny", device="cpu")
    reference = output_latents(built())
    built.pipe.save_pretrained(tmp_path / "wan-tiny")
    loaded = build(catalog()["wan"], size="pretrained", device="cpu", dtype=torch.float32,
                   checkpoint=str(tmp_path / "wan-tiny"), call="tiny")
    assert type(loaded.pipe.transformer).__name__ == "WanTransformer3DModel"
    # same weights and seed; loading may reorder float32 work (e.g. modules kept in fp32), so allow rounding
    torch.testing.assert_close(output_latents(loaded()), reference, rtol=1e-5, atol=1e-5)


def test_pretrained_loading_from_the_command_line(tmp_path):
    built = build(catalog()["flux"], size="tiny", device="cpu")
    built.pipe.save_pretrained(tmp_path / "flux-tiny")
    out = lab_here("run", "--pipeline", "flux", "--size", "pretrained", "--checkpoint", str(tmp_path / "flux-tiny"),
                   "--call", "tiny", "--device", "cpu")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "output (1, 16, 4)" in out.stdout
    missing = lab_here("run", "--pipeline", "flux", "--size", "pretrained", "--checkpoint", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "Could not load" in missing.stderr and "Traceback" not in missing.stderr


def test_full_size_estimates_match_the_true_architectures():
    counts = {name: estimate(s, "full", None, torch.bfloat16).params[s.denoiser] for name, s in catalog().items()}
    assert 11.5e9 < counts["flux"] < 12.5e9  # FLUX.1-dev: 12B
    assert 11.5e9 < counts["flux_kontext"] < 12.5e9  # FLUX.1 Kontext [dev]: 12B
    assert 2.5e9 < counts["sdxl"] < 2.7e9  # the SDXL base UNet: 2.6B
    assert 7.9e9 < counts["sd35"] < 8.3e9  # SD3.5 Large: 8.1B
    assert 8.7e9 < counts["chroma"] < 9.1e9  # Chroma1-HD: 8.9B
    assert 12.5e9 < counts["hunyuan_video"] < 13.5e9  # HunyuanVideo: 13B
    assert 5.9e9 < counts["zimage"] < 6.4e9  # Z-Image: 6B
    assert 1.8e9 < counts["cosmos2"] < 2.1e9  # Cosmos-Predict2 2B
    assert 14.0e9 < counts["wan22"] < 14.6e9  # Wan2.2 A14B: 14B per expert (the second counted apart)
    assert 5.3e9 < counts["cogvideox"] < 5.8e9  # CogVideoX-5b
    assert 9.8e9 < counts["mochi"] < 10.3e9  # Mochi 1: 10B
    assert 2.5e9 < counts["lumina2"] < 2.7e9  # Lumina-Image 2.0: 2.6B
    assert 6.7e9 < counts["auraflow"] < 7.0e9  # AuraFlow v0.3: 6.8B
    assert 1.5e9 < counts["sana"] < 1.7e9  # SANA 1600M
    assert 8.5e9 < counts["flux2"] < 9.8e9  # Klein 9B
    assert 13.5e9 < counts["wan"] < 14.8e9  # Wan 14B
    assert 19e9 < counts["qwenimage"] < 21e9  # Qwen-Image 20B
    layers = estimate(catalog()["wan"], "full", 2, torch.bfloat16).params["transformer"]
    assert layers < counts["wan"] / 10


def test_an_estimate_counts_what_a_plain_meta_build_holds_and_leaves_torch_init_as_it_was():
    """`estimate` skips `torch.nn.init`'s initializers while it builds on the meta device (they write nothing there):
    the counts are a plain meta build's, and the initializers are torch's own again afterwards, after an error too."""
    from lab.run.scenario import _no_weight_init, resolve

    initializers = dict(vars(torch.nn.init))
    scenario = catalog()["qwenimage"]
    counted = estimate(scenario, "tiny", None, torch.float32).params
    for name, model in scenario.models.items():
        with torch.device("meta"):
            module = resolve(model.cls)(**scenario.config(name, "tiny", None))
        assert counted[name] == sum(p.numel() for p in module.parameters()) > 0
    assert dict(vars(torch.nn.init)) == initializers
    with pytest.raises(RuntimeError), _no_weight_init():
        assert torch.nn.init.normal_ is not initializers["normal_"]
        raise RuntimeError
    assert dict(vars(torch.nn.init)) == initializers



def test_unknown_scenario_names_the_closest():
    out = lab_here("run", "--pipeline", "wna")
    assert out.returncode == 2 and "Did you mean `wan`?" in out.stderr and "Traceback" not in out.stderr


def test_full_wan_on_this_cpu_is_refused_before_allocating():
    out = lab_here("run", "--pipeline", "wan", "--size", "full", "--device", "cpu")
    assert out.returncode == 2
    assert "needs about" in out.stderr and "--size tiny" in out.stderr and "--layers" in out.stderr


def test_fix_for_another_pipeline_is_a_clear_error():
    out = lab_here("run", "--pipeline", "wan", "--fix", "qwen_modulate_index")
    assert out.returncode == 2 and "does not apply to the `wan` pipeline" in out.stderr


def test_layers_needs_full():
    out = lab_here("run", "--pipeline", "wan", "--size", "tiny", "--layers", "2")
    assert out.returncode == 2 and "--layers N" in out.stderr


@pytest.mark.slow
def test_scenarios_listing():
    out = lab_here("scenarios")
    assert out.returncode == 0, out.stderr
    for name in SHAPES:
        assert name in out.stdout
    assert "Default here: --size tiny on cpu" in out.stdout

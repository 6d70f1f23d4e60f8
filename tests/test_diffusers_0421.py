"""Against diffusers 0.42.1 (the newest): fixes already upstream say so and are skipped; the rest still apply."""

import json
import os

import pytest

from tests.conftest import ROOT, diffusers_release, lab_series

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow

ASKED = ("unipc_stack", "unipc_device_const", "hook_registry_cache", "qwen_modulate_index", "unipc_host_coeffs",
         "pab_timestep_once", "cogvideox_host_timestep", "mochi_prompt_tokens_once", "lumina2_caption_lengths_once",
         "flux2_unpack_hw")


@pytest.fixture(scope="module")
def on_0421() -> dict:
    """The three commands below, in one process whose `PYTHONPATH` puts diffusers 0.42.1 first (one interpreter, not
    three, importing torch and that diffusers)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(diffusers_release("0.42.1")), str(ROOT)])
    # the fixes named, as asked (begin_index, whose 49 modules take most of a whole listing, is not among them)
    status, skipped, missing = lab_series(
        ["fixes", "--json", *ASKED, "unipc_stack"],
        ["run", "--pipeline", "wan", "--size", "tiny", "--device", "cpu", "--fix", "unipc_stack"],
        ["run", "--pipeline", "qwenimage_zero_cond", "--size", "tiny", "--device", "cpu", "--fix", "qwen_modulate_index"],
        env=env)
    return {"status": status, "skipped": skipped, "missing": missing}


def test_fixes_status_on_0421(on_0421):
    result = on_0421["status"]
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["diffusers"] == "0.42.1"
    assert tuple(f["fix"] for f in report["fixes"]) == ASKED  # each once, in the order named
    status = {f["fix"]: f["status"] for f in report["fixes"]}
    assert "already upstream (since 0.38.0): scheduling_unipc_multistep" in status["unipc_stack"]
    assert "already upstream (since 0.38.0): scheduling_unipc_multistep" in status["unipc_device_const"]
    assert "already upstream (since 0.41.0): hooks" in status["hook_registry_cache"]
    assert "applies (1 of 1 sites)" in status["qwen_modulate_index"]
    assert "applies (1 of 1 sites)" in status["unipc_host_coeffs"]  # the 0.38+ shape is rewritten too
    assert "applies (1 of 1 sites)" in status["pab_timestep_once"]  # found by the lab: still per attention call
    # found by the census: still in 0.42.1
    assert "applies (6 of 6 sites)" in status["cogvideox_host_timestep"]
    assert "applies (1 of 1 sites)" in status["mochi_prompt_tokens_once"]
    assert "applies (1 of 1 sites)" in status["lumina2_caption_lengths_once"]
    # Klein is upstream; Flux2Pipeline and the Klein inpaint and KV pipelines are not
    assert "applies (3 of 4 sites)" in status["flux2_unpack_hw"]
    assert "already upstream (since 0.38.0): pipeline_flux2_klein" in status["flux2_unpack_hw"]


def test_upstream_fix_is_skipped_with_a_message(on_0421):
    result = on_0421["skipped"]
    assert result.returncode == 0, result.stderr
    assert "already upstream in diffusers 0.42.1 (since 0.38.0); skipped" in result.stderr


def test_missing_fix_still_applies_and_runs(on_0421):
    result = on_0421["missing"]
    assert result.returncode == 0, result.stderr
    assert "qwen_modulate_index" in result.stdout

"""`lab profile` on CPU: a real CPU-only trace with the lab's annotations, analysed; the fix's effect shows."""


import pytest

from lab.apply.fix import applied, get_fix
from lab.run.profile import ProfileOptions, profile_call
from lab.run.scenario import build, get_scenario
from lab.traces.analysis import analyze
from lab.traces.trace import load


@pytest.fixture(scope="module")
def wan():
    return build(get_scenario("wan"), size="tiny", device="cpu")


def trace_of(built, tmp_path, stem, fixes=(), **options):
    with applied([get_fix(f) for f in fixes], built.pipe):
        paths = profile_call(built, tmp_path, stem, ProfileOptions(**options))
    return paths, analyze(load(paths["trace"]))


@pytest.mark.slow
def test_annotations_and_host_reads(wan, tmp_path):
    _, r = trace_of(wan, tmp_path, "control")
    assert r["steps"] == 4
    assert r["regions"]["regions"]["transformer_forward"]["count"] == 8  # CFG: two calls per step
    assert r["regions"]["regions"]["scheduler_step"]["count"] == 4
    assert r["cpu_gaps"]["count"] == 7
    # UniPC 0.37.1 copies each rks/b entry to a tensor with .item(): host scalar reads in steps 1..3
    assert r["host_reads"]["scalar_reads"] > 10
    assert r["host_reads"]["scalar_reads_per_step"]["2"] > 0


@pytest.mark.slow
def test_unipc_stack_removes_host_scalar_reads(wan, tmp_path):
    _, control = trace_of(wan, tmp_path, "control")
    _, test = trace_of(wan, tmp_path, "test", fixes=("unipc_stack", "unipc_device_const"))
    assert test["host_reads"]["scalar_reads"] < control["host_reads"]["scalar_reads"]
    sites = test["host_reads"]["scalar_read_sites"]
    # the predictor no longer reads scalars; what remains in the corrector is torch.linalg.solve's own check
    assert not any("multistep_uni_p_bh_update" in s for s in sites)
    assert any("[lab fix: unipc_stack+unipc_device_const]" in s for s in sites)


def test_step_selective_capture_and_extras(wan, tmp_path):
    paths, r = trace_of(wan, tmp_path, "sel", skip_steps=2, capture_steps=1, op_tables=("summary",), with_stack=False)
    assert r["steps"] == 1
    assert paths["ops_summary"].read_text().startswith("| name")

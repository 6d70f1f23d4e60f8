"""`lab sweep`: parsing, setting a point, and a small sweep end to end on CPU."""

import json

import msgspec
import pytest

from lab import results
from lab.base.errors import UsageError, known_hint
from lab.measure import sweep
from lab.pages import sweep_report
from lab.results.schema import SweepResult
from lab.run.runner import CompileSpec
from lab.run.scenario import build, get_scenario
from lab.verdicts.verdict import Verdict
from tests.conftest import ROOT, ctrl_c_at, lab_here

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


def test_parse_vary():
    assert sweep.parse_vary("height=256,512") == ("height", [256, 512])
    assert sweep.parse_vary("compile=eager,reduce-overhead") == ("compile", ["eager", "reduce-overhead"])
    with pytest.raises(UsageError, match="Did you mean `height`"):
        sweep.parse_vary("heigth=1,2")
    with pytest.raises(UsageError, match="integers"):
        sweep.parse_vary("steps=a,b")
    with pytest.raises(UsageError, match="KEY=V1,V2"):
        sweep.parse_vary("steps")


def test_apply_point_sets_the_call():
    built = build(get_scenario("wan"), size="tiny", device="cpu")
    sweep.apply_point(built, "frames", 5, CompileSpec())
    sweep.apply_point(built, "batch", 2, CompileSpec())
    assert built.call_kwargs["num_frames"] == 5 and built.call_kwargs["num_videos_per_prompt"] == 2
    spec = sweep.apply_point(built, "compile", "reduce-overhead", CompileSpec())
    assert spec.mode == "compile" and spec.compile_mode == "reduce-overhead"
    flux = build(get_scenario("flux"), size="tiny", device="cpu")
    with pytest.raises(UsageError, match="no frames"):
        sweep.apply_point(flux, "frames", 5, CompileSpec())


def test_sweep_end_to_end(tmp_path):
    proc = lab_here(
        "sweep", "--fix", "unipc_stack", "--pipeline", "wan", "--vary", "batch=1,2",
        "--blocks", "6", "--repeat", "1", "--no-profile", "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "wan" / "unipc_stack__batch__eager__tiny__cpu.json").read_text())
    assert [p["value"] for p in result["points"]] == [1, 2]
    assert all(p["verify"]["exercised"]["unipc_stack"] == 7 for p in result["points"])
    # each point keeps its design and blocks as an A/B result does, so `lab table --restat` decides it as it ran
    assert all(p["design"]["kind"] == "fixed" and len(p["order"]) == len(p["block_s"]) == 6 and p["stopped"]
               for p in result["points"])
    assert (tmp_path / "wan" / "unipc_stack__batch__eager__tiny__cpu.png").exists()
    assert "| batch | verdict |" in proc.stdout


def test_an_interrupted_replace_keeps_the_sweep_it_was_to_replace(tmp_path, monkeypatch):
    from lab import cli

    argv = ["sweep", "--fix", "unipc_stack", "--pipeline", "wan", "--vary", "batch=1,2", "--blocks", "6", "--repeat",
            "1", "--profile-calls", "1", "--out", str(tmp_path / "sweep"), "--trace-dir", str(tmp_path / "traces")]
    assert cli.main(argv) == 0
    path = tmp_path / "sweep" / "wan" / "unipc_stack__batch__eager__tiny__cpu.json"
    before = path.read_text()
    traces = {p.name: p.read_bytes() for p in (tmp_path / "traces").glob("*.json.gz")}
    assert len(traces) == 4  # one profiled call per arm and point
    ctrl_c_at(monkeypatch, 16)  # in the first point's blocks: the sweep stops there, keeping that point's blocks
    cli.main(argv + ["--replace"])
    assert path.read_text() == before  # kept as it was, and so are its traces
    assert {p.name: p.read_bytes() for p in (tmp_path / "traces").glob("*.json.gz")} == traces
    assert list((tmp_path / "traces" / "interrupted" / "wan" / path.stem).glob("*.json.gz"))  # this run's
    aside = json.loads((tmp_path / "traces" / "interrupted" / "wan" / path.name).read_text())
    assert [p["value"] for p in aside["points"]] == [1] and aside["points"][0]["interrupted"]


def test_a_failing_point_is_recorded_and_the_others_kept(tmp_path):
    from lab.measure import ab

    # what torch raised at the Flux2 reduce-overhead point (results/sweep/flux2/hook_registry_cache__compile__full__h200)
    overwritten = "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run."
    builds = iter([lambda: build(get_scenario("wan"), size="tiny", device="cpu"),
                   lambda: (_ for _ in ()).throw(RuntimeError(overwritten)),
                   lambda: build(get_scenario("wan"), size="tiny", device="cpu")])
    points = sweep.sweep(lambda: next(builds)(), [], "batch", [1, 2, 3], CompileSpec(),
                         ab.ABConfig(blocks=2, repeat=1, warmup=0, profile=False), tmp_path, "x", lambda _: None)
    assert [(p["value"], p["verdict"]) for p in points][1] == (2, Verdict.FAILED)
    assert points[1]["summary"] == f"RuntimeError: {overwritten}{known_hint(RuntimeError(overwritten))}"  # the hint too
    assert "--no-compile-regional" in points[1]["summary"] and points[1]["mode"] is None  # failed before the point was set
    assert points[0]["samples"] and points[2]["samples"]  # the points around it ran
    result = msgspec.convert({"name": "x", "created": "", "fixes": [], "scenario": "wan", "key": "batch",
                              "values": [1, 2, 3], "size": "tiny", "base_mode": "eager", "config": {},
                              "environment": {"gpu": None}, "points": points, "command": "lab sweep ..."}, SweepResult)
    assert f"- batch = 2: failed: RuntimeError: {overwritten}" in sweep_report.markdown(result, None)


def test_varying_the_compile_mode_names_no_mode(tmp_path):
    proc = lab_here(
        "sweep", "--fix", "no_progress_bar", "--pipeline", "wan", "--vary",
        "compile=eager", "--blocks", "2", "--repeat", "1", "--warmup", "0", "--no-profile", "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "wan" / "no_progress_bar__compile__tiny__cpu.json").read_text())
    assert result["base_mode"] == "mode per point, regional compile" and result["points"][0]["mode"] == "eager"
    assert "tiny · mode per point, regional compile · " in proc.stdout and "| eager | " in proc.stdout


def test_a_compile_sweep_page_says_how_each_point_was_compiled():
    measured = results.read(ROOT / "results" / "sweep" / "flux2" / "hook_registry_cache__compile-whole__full__h200.json")
    page = sweep_report.markdown(measured, None)
    assert "| reduce-overhead: compile (full, fullgraph=False, mode=reduce-overhead, outputs cloned) | faster, within ±1% |" in page
    assert "full · mode per point, whole-transformer compile · NVIDIA H200" in page
    assert measured.base_mode == "mode per point"  # written before sweeps recorded what was compiled
    regional = results.read(ROOT / "results" / "sweep" / "flux2" / "hook_registry_cache__compile__full__h200.json")
    assert sweep_report.setting(regional) == "mode per point, regional compile"


def test_the_page_names_the_transformer_blocks_kept():
    # a sweep of Wan at 4 blocks written before sweeps recorded their blocks (H200, replaced in results/ since)
    old = results.read(ROOT / "tests" / "data" / "sweep_written_before_layers.json")
    assert old.layers is None  # written before sweeps recorded it: the command still says
    assert results.layers(old) == 4
    assert "full, 4 transformer blocks · eager" in sweep_report.markdown(old, None)
    assert results.layers({"layers": None, "command": "lab sweep --fix x --pipeline wan"}) is None
    assert results.layers({"layers": 8, "command": ""}) == 8

"""The two reports that check the lab's builds: what a tiny run leaves out of diffusers (a pure comparison of two
line records) and the lab's build against the user's `from_pretrained` path (its exact counts)."""

import importlib.util
import sys

import pytest

from tests.conftest import ROOT


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_lines_left_out_are_those_only_the_full_run_ran():
    tiny_coverage = _benchmark("tiny_coverage")
    tiny = {"runs": {"wan": {"diffusers/a.py": [1, 2, 3]}, "ltx2": {"diffusers/b.py": [1]},
                     "qwen": {"error": "MissingClass: no QwenImagePipeline"}}}
    full = {"runs": {"wan": {"diffusers/a.py": [1, 2, 3, 7], "diffusers/c.py": [4]}, "ltx2": {"diffusers/b.py": [1]},
                     "qwen": {"diffusers/q.py": [1]}}}
    assert tiny_coverage.left_out(tiny, full) == {"wan": {"diffusers/a.py": [7], "diffusers/c.py": [4]}}


def test_the_build_counts_compare_only_exact_counts():
    faithful_build = _benchmark("faithful_build")
    analysis = {"syncs": {"count": 2, "sites": {"diffusers/x.py:10 f": {"count": 2, "blocked_us": 31.5}}},
                "host_reads": {"scalar_reads": 3, "scalar_read_sites": {"diffusers/x.py:10 f": 3},
                               "memcpy": {"HtoD": {"count": 8, "bytes": 64}}},
                "launches": {"per_step": {"0": 100, "1": 100, "outside": 4}}}
    assert faithful_build.counts(analysis) == {
        "syncs": 2, "sync_sites": {"diffusers/x.py:10 f": 2}, "host_scalar_reads": 3,
        "scalar_read_sites": {"diffusers/x.py:10 f": 3}, "memcpy_HtoD": 8, "memcpy_DtoH": 0,
        "launches_per_step": {"0": 100, "1": 100, "outside": 4}}


def test_a_merged_build_report_keeps_other_scenarios_rows_with_the_run_they_came_from():
    faithful_build = _benchmark("faithful_build")
    row = {"lab": {}, "user": {}, "differ": [], "outputs_bit_identical": True}
    old = {"size": "full --layers 2, bfloat16", "device": "NVIDIA H200", "command": "old cmd",
           "environment": "torch 1", "lab_commit": "aaa", "rows": [{"scenario": "wan", **row},
                                                                   {"scenario": "sdxl", **row, "differ": ["syncs"]}]}
    new = {**old, "command": "new cmd", "environment": "torch 2", "lab_commit": "bbb",
           "rows": [{"scenario": "sdxl", **row, "command": "new cmd", "environment": "torch 2", "lab_commit": "bbb"}]}
    report = faithful_build.merged(old, new)
    assert [r["scenario"] for r in report["rows"]] == ["sdxl", "wan"]  # the catalog's order
    by_name = {r["scenario"]: r for r in report["rows"]}
    assert by_name["sdxl"]["differ"] == [] and by_name["sdxl"]["lab_commit"] == "bbb"
    assert by_name["wan"]["lab_commit"] == "aaa" and by_name["wan"]["command"] == "old cmd"
    runs = faithful_build._runs(report)
    assert any("old cmd" in line and "wan" in line for line in runs)
    assert any("new cmd" in line and "sdxl" in line for line in runs)
    with pytest.raises(SystemExit, match="merge only runs of one size and device"):
        faithful_build.merged({**old, "device": "NVIDIA H100 80GB HBM3"}, new)


def test_a_merged_line_record_keeps_other_scenarios_and_refuses_another_setup():
    tiny_coverage = _benchmark("tiny_coverage")
    setup = {"size": "full", "layers": 2, "device": "NVIDIA H200", "dtype": None, "diffusers": "0.37.1",
             "torch": "2.11.0", "machine": "x86_64"}
    old = {**setup, "command": "record A", "runs": {"wan": {"diffusers/a.py": [1]}, "sdxl": {"error": "X: y"}}}
    new = {**setup, "command": "record B", "runs": {"sdxl": {"diffusers/b.py": [2]}}}
    record = tiny_coverage.merged(old, new)
    assert record["runs"] == {"wan": {"diffusers/a.py": [1]}, "sdxl": {"diffusers/b.py": [2]}}
    assert record["commands"] == {"wan": "record A", "sdxl": "record B"}
    assert tiny_coverage._commands(record) == "`record A` (wan); `record B` (sdxl)"
    with pytest.raises(SystemExit, match="torch"):
        tiny_coverage.merged({**old, "torch": "2.13.0"}, new)


def test_full_line_records_of_several_gpus_join_and_refuse_a_scenario_twice():
    tiny_coverage = _benchmark("tiny_coverage")
    h200 = {"diffusers": "0.37.1", "device": "NVIDIA H200", "command": "record A", "runs": {"wan": {"d/a.py": [1]}}}
    h100 = {"diffusers": "0.37.1", "device": "NVIDIA H100", "command": "record B", "runs": {"sdxl": {"d/b.py": [2]}}}
    assert tiny_coverage.joined([h200, h100])["runs"] == {"wan": {"d/a.py": [1]}, "sdxl": {"d/b.py": [2]}}
    assert tiny_coverage._made_by([h200, h100]) == "`record A` (NVIDIA H200); `record B` (NVIDIA H100)"
    with pytest.raises(SystemExit, match="wan are in two full records"):
        tiny_coverage.joined([h200, {**h100, "runs": {"wan": {}}}])
    with pytest.raises(SystemExit, match="0.37.1, 0.42.1"):
        tiny_coverage.joined([h200, {**h100, "diffusers": "0.42.1"}])


def test_a_line_only_the_true_config_can_run_takes_its_reason_from_the_scenario():
    tiny_coverage = _benchmark("tiny_coverage")
    reasons = tiny_coverage._scenario_reasons("sana")
    assert "the aspect-ratio bins" in reasons["diffusers/pipelines/sana/pipeline_sana.py:869"]
    assert tiny_coverage._scenario_reasons("wan") == {} and tiny_coverage._scenario_reasons("no_such") == {}

"""Other diffusers than the installed one: SPECs resolved offline, two diffusers side by side, and `lab history`."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from lab import results
from lab.apply import releases
from lab.base.errors import UsageError
from lab.measure import history as history_measure
from lab.pages import history_report
from lab.results.schema import HistoryResult, HistoryRow, Workers
from lab.run.description import Run
from tests.conftest import ROOT, diffusers_release, drawn, lab_here


def test_specs_name_a_release_a_checkout_a_site_packages_folder_or_a_wheel(tmp_path):
    assert releases.resolve("0.37.1").site is None  # the installed one: no worker path needed
    release = releases.resolve("0.38.0")
    assert release.version == "0.38.0" and (release.site / "diffusers" / "__init__.py").is_file()
    assert release.origin.startswith("release wheel ")
    checkout = tmp_path / "diffusers-checkout"
    shutil.copytree(diffusers_release("0.38.0") / "diffusers", checkout / "src" / "diffusers")
    assert releases.resolve(str(checkout)).origin == f"checkout {checkout}"
    assert releases.resolve(str(checkout / "src")).origin == f"site-packages {checkout / 'src'}"
    wheel = releases.resolve(str(releases.find_wheel("0.38.0")))
    assert wheel.version == "0.38.0" and wheel.origin.startswith("wheel ")


@pytest.mark.parametrize("spec,message", [
    ("banana", "`banana` names no diffusers: give a release"),
    ("/", "/ holds no diffusers"),
])
def test_bad_specs_are_one_clear_error(spec, message):
    with pytest.raises(UsageError, match=message):
        releases.resolve(spec)


def test_a_release_that_cannot_be_found_says_where_to_put_its_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_WHEELS", str(tmp_path / "wheels"))
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UsageError) as e:
        releases.resolve("0.0.999")
    assert "diffusers 0.0.999: no wheel in" in str(e.value) and "pip could not download one" in str(e.value)
    assert "Put diffusers-0.0.999-py3-none-any.whl into one of those folders" in str(e.value)


def test_two_diffusers_take_no_fix():
    proc = lab_here("ab", "--test-diffusers", "0.38.0", "--fix", "unipc_stack", "--pipeline", "wan")
    assert proc.returncode == 2 and "take no `--fix`, `--patch` or `--control aa`" in proc.stderr


@pytest.mark.slow
def test_history_skips_a_release_without_the_pipeline_and_measures_the_rest(tmp_path):
    # Flux2 Klein arrived in 0.37.0: 0.36.0 has no Flux2KleinPipeline. 0.38.0's pair is measured against 0.37.1 (one
    # pair of worker processes: fresh pairs per block are tested in test_ab and test_worker_pairs)
    proc = lab_here("history", "--pipeline", "flux2", "--diffusers", "0.36.0,0.37.1,0.38.0", "--reference", "0.37.1",
                    "--blocks", "2", "--repeat", "1", "--one-pair", "--profile-calls", "1", "--out",
                    str(tmp_path / "history"), "--ab-out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "tr"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "history" / "flux2__eager__tiny__cpu.json").read_text())
    rows = {r["version"]: r for r in history["releases"]}
    assert rows["0.37.1"]["status"] == "reference"
    assert rows["0.36.0"]["status"] == "skipped" and "diffusers 0.36.0 has no `diffusers.Flux2KleinPipeline`" in rows["0.36.0"]["why"]
    assert rows["0.38.0"]["status"] == "measured"
    pair = json.loads(Path(rows["0.38.0"]["result"]).read_text())
    assert pair["isolated"] and pair["diffusers"]["test"]["version"] == "0.38.0" and pair["workers"]["processes"] == 2


@pytest.mark.slow
def test_two_diffusers_side_by_side_and_a_history_over_them(tmp_path, capfd):
    """`lab ab --control-diffusers --test-diffusers` runs in this process (`lab.cli.main`; a process of its own would
    only import torch and diffusers again); its two workers, each importing its diffusers, are real processes, and
    what they print reaches this process's file descriptors only if they leak it (`capfd` reads both). A history
    over the same two releases keeps that pair, which is its pair (one that measures: the test above)."""
    from lab import cli

    code = cli.main(["ab", "--control-diffusers", "0.37.1", "--test-diffusers", "0.38.0", "--pipeline", "wan",
                     "--blocks", "2", "--one-pair", "--repeat", "1", "--profile-calls", "1", "--out",
                     str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "tr")])
    proc = capfd.readouterr()
    assert code == 0, proc.err[-3000:]
    path = tmp_path / "ab" / "wan" / "diffusers-0.37.1-to-0.38.0__eager__tiny__cpu.json"
    result = json.loads(path.read_text())
    assert result["isolated"] and result["fixes"] == []
    assert result["diffusers"]["control"]["version"] == "0.37.1" and result["diffusers"]["test"]["version"] == "0.38.0"
    reads = result["profile"]["metrics"]["host_scalar_reads"]
    assert reads["test"] < reads["control"]  # 0.38.0 shipped the UniPC change: fewer .item() reads per call
    assert result["verify"]["identical"]
    page = path.with_suffix(".md").read_text()
    assert page.startswith("# `diffusers 0.37.1 -> 0.38.0` on `wan`")
    assert "Control: diffusers 0.37.1 (installed: " in page and "test: diffusers 0.38.0 (release wheel " in page
    assert "%|" not in proc.err  # the workers' progress bars go to their own logs
    assert result["workers"]["design"] == "one pair" and result["workers"]["processes"] == 2
    assert "Worker processes: **one pair for all blocks** (uncalibrated)" in page

    history_run = lab_here("history", "--pipeline", "wan", "--diffusers", "0.37.1,0.38.0", "--blocks", "2",
                           "--one-pair", "--out", str(tmp_path / "history"), "--ab-out", str(tmp_path / "ab"))
    assert history_run.returncode == 0 and "kept " in history_run.stderr  # the pair measured is kept: a history resumes
    base = tmp_path / "history" / "wan__eager__tiny__cpu"
    history = json.loads(base.with_suffix(".json").read_text())
    assert [r["version"] for r in history["releases"]] == ["0.37.1", "0.38.0"]
    ref, new = history["releases"]
    assert ref["status"] == "reference" and new["status"] == "kept"
    assert new["metrics"]["host_scalar_reads"]["test"] < ref["metrics"]["host_scalar_reads"]["test"]
    assert new["result"] == str(path)
    page = base.with_suffix(".md").read_text()
    assert "| 0.38.0 | [" in page and "(../ab/wan/diffusers-0.37.1-to-0.38.0__eager__tiny__cpu.md)" in page
    assert drawn(base.with_suffix(".png"))
    # a history with fresh pairs (the default) measures it again: one pair for all blocks is another design
    pair = results.read(path)
    fresh = SimpleNamespace(run=Run(scenario="wan", size="full", device="cuda"), config=SimpleNamespace(one_pair=False))
    assert history_measure.owed(pair, fresh) == "it was measured with one pair, this history with fresh pair per block"
    same = SimpleNamespace(run=Run(scenario="wan", size="full", device="cuda"), config=SimpleNamespace(one_pair=True))
    assert history_measure.owed(pair, same) is None


def test_a_history_measures_again_the_pairs_of_the_old_build_and_of_one_pair():
    """The committed tiny-call pair of 0.38.0 (H200): the lab's old build, one pair of worker processes; a pair cut
    short by a time limit is measured again too."""
    old = results.read(ROOT / "results/ab/wan/diffusers-0.37.1-to-0.38.0__eager__full-2l-tinycall__h200.json")
    fresh = SimpleNamespace(run=Run(scenario="wan", size="full", device="cuda"), config=SimpleNamespace(one_pair=False))
    assert history_measure.owed(old, fresh) == (
        "its pipelines were made by the old build, this history's by the faithful build; it was measured with one "
        "pair, this history with fresh pair per block")
    workers = msgspec.convert({"design": "fresh pair per block", "pairs": 6, "processes": 12}, Workers)
    new = msgspec.structs.replace(old, build="faithful", workers=workers)
    assert history_measure.owed(new, fresh) is None
    assert history_measure.owed(msgspec.structs.replace(new, stopped="time limit"), fresh) == (
        "it was cut short (a Ctrl-C or a time limit)")


def test_a_history_under_a_time_limit_starts_no_pair_that_would_end_past_it():
    margin = history_measure.blocks.DEADLINE_MARGIN_S
    assert not history_measure.past_limit([], 1000.0, 999.0)  # the first pair always starts
    assert not history_measure.past_limit([60.0, 90.0], None, 0.0)  # no limit
    assert not history_measure.past_limit([60.0, 90.0], 1000.0, 1000.0 - 90.0 - margin)
    assert history_measure.past_limit([60.0, 90.0], 1000.0, 1000.0 - 90.0 - margin + 1.0)  # by the longest pair
    reference = SimpleNamespace(version="0.37.1")
    versions = [SimpleNamespace(version=v, origin="wheel") for v in ("0.37.1", "0.38.0")]
    rows = history_measure._not_reached(versions, reference, "the campaign's time limit came first")
    assert [(r.version, r.status) for r in rows] == [("0.37.1", "reference"), ("0.38.0", "not reached")]
    page = history_report.markdown(msgspec.convert(
        {"name": "h", "created": "", "scenario": "wan", "size": "tiny", "steps": 4, "mode": "eager",
         "reference": {"version": "0.37.1"}, "releases": msgspec.to_builtins(rows), "command": "lab history",
         "config": {}, "environment": {"cpus": 2, "torch": "2.13", "lab_commit": "x"}}, HistoryResult))
    assert "| 0.38.0 | not reached | the campaign's time limit came first |" in page


def test_a_history_that_went_on_from_an_earlier_run_says_its_time_is_the_last_runs():
    """The committed true-call history (H200): its second run kept three pairs of the first."""
    history = results.read(ROOT / "results/history/wan__eager__full-2l__h200.json")
    assert [r.version for r in history.releases if r.status == "kept"] == ["0.36.0", "0.38.0", "0.39.0"]
    page = history_report.markdown(history, None)
    assert "in its last run, which kept the pairs of 0.36.0, 0.38.0, 0.39.0 from an earlier one." in page
    assert " in all." not in page


def test_steps_between_releases_are_where_neighbouring_intervals_part():
    rows = msgspec.convert([{"version": "1", "status": "reference", "ratio": 1.0},
                            {"version": "2", "status": "measured", "ratio": 1.001, "ci": [0.995, 1.006]},
                            {"version": "3", "status": "measured", "ratio": 1.10, "ci": [1.08, 1.12]},
                            {"version": "4", "status": "skipped"},
                            {"version": "5", "status": "measured", "ratio": 1.09, "ci": [1.07, 1.11]}], list[HistoryRow])
    found = history_report.steps(rows)
    assert [(s["from"], s["to"], s["direction"]) for s in found] == [("2", "3", "slower")]
    assert found[0]["change"] == pytest.approx(1.10 / 1.001 - 1)


def test_count_changes_name_the_release_that_changed_a_count():
    def row(version, status, reads, syncs=0):
        return HistoryRow(version=version, status=status,
                          metrics={"host_scalar_reads": {"test": reads}, "syncs": {"test": syncs}})

    rows = [row("0.37.1", "reference", 22), row("0.38.0", "measured", 6), HistoryRow(version="0.39.0", status="failed"),
            row("0.40.0", "measured", 6), row("0.41.0", "measured", 10, syncs=1)]
    found = history_report.count_changes(rows)
    assert [(c["from"], c["to"], c["metric"], c["before"], c["after"]) for c in found] == [
        ("0.37.1", "0.38.0", "host_scalar_reads", 22, 6),
        ("0.40.0", "0.41.0", "syncs", 0, 1),
        ("0.40.0", "0.41.0", "host_scalar_reads", 6, 10)]
    page = history_report.markdown(msgspec.convert(
        {"name": "h", "created": "", "scenario": "wan", "size": "tiny", "mode": "eager", "steps": 4,
         "reference": {"version": "0.37.1"}, "releases": msgspec.to_builtins(rows), "command": "lab history",
         "config": {}, "environment": {"cpus": 2, "torch": "2.13", "lab_commit": "x"}}, HistoryResult))
    assert "- 0.40.0 -> 0.41.0: host scalar reads 6 -> 10" in page


def test_release_pairs_are_in_their_own_section_of_the_results_readme():

    text = (ROOT / "results" / "README.md").read_text()
    section = text.split("## diffusers releases", 1)[1]
    assert "[wan__eager__full-2l__h200](history/wan__eager__full-2l__h200.md)" in section
    assert "0.39.0 -> 0.40.0: 6.0 % faster" in section
    # the tiny-call history is the old build's (no "build" recorded); the true-call one the faithful build's
    assert "| wan | NVIDIA H200, eager, full, 2 blocks, tiny call, old build | 0.37.1 |" in section
    assert "| wan | NVIDIA H200, eager, full, 2 blocks | 0.37.1 |" in section
    before = text.split("## diffusers releases", 1)[0]
    assert "](ab/wan/diffusers-" not in before  # not a column of the fix tables


def test_a_release_named_twice_is_refused_before_anything_is_written(tmp_path):
    page = tmp_path / "history.md"
    page.write_text("an earlier history\n")
    proc = lab_here("history", "--pipeline", "wan", "--diffusers", "0.37.1,0.37.1", "--out", str(tmp_path))
    assert proc.returncode == 2 and "names `0.37.1` twice" in proc.stderr, proc.stderr
    assert page.read_text() == "an earlier history\n" and sorted(p.name for p in tmp_path.iterdir()) == ["history.md"]

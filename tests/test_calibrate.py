"""`lab calibrate` end to end on CPU (tiny Wan): both kinds of trial run, the report says what they found."""

import json

import pytest

from lab.measure.calibrate import wilson
from tests.conftest import drawn, lab, lab_here


def test_wilson_interval_on_literal_counts():
    lo, hi = wilson(1, 40)
    assert round(lo, 3) == 0.004 and round(hi, 3) == 0.129  # the committed CPU calibration's row
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.mark.slow
def test_calibrate_writes_false_positive_rate_and_power_and_goes_on_from_its_trials(tmp_path, monkeypatch, capfd):
    """The first run is `lab calibrate` in a process of its own, as a user runs it; the runs that go on from it run
    in this one (`lab.cli.main`), from `tmp_path`, where their logs go. What they say is read from file descriptor 2,
    where the lab's progress lines go while the pipelines' output goes to the log."""
    from lab import cli

    base = ("calibrate", "--pipeline", "wan", "--blocks", "3", "--repeat", "1", "--stall-ms", "5", "--out", str(tmp_path))
    first = lab(*base, "--trials", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    path = tmp_path / "wan__eager__tiny__cpu.json"
    before = json.loads(path.read_text())
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert cli.main([*base, "--trials", "2", "--resume"]) == 0
    assert "going on from 1 A/A and 1 positive trial(s)" in capfd.readouterr().err
    r = json.loads(path.read_text())
    assert r["kind"] == "calibration" and r["aa"]["trials"] == r["positive"]["trials"] == 2 and not r["interrupted"]
    # the first run's trials are kept as they were; the new ones go on with the next seed
    assert r["trials"]["aa"][0] == before["trials"]["aa"][0]
    assert [t["trial"] for t in r["trials"]["positive"]] == [0, 1]
    assert all(len(t["control_ms"]) == 3 for t in r["trials"]["aa"] + r["trials"]["positive"])
    # each trial keeps which arm went first in each block and every timed call (1 per arm per block)
    t = r["trials"]["aa"][0]
    assert len(t["first"]) == 3 and set(t["first"]) <= {"control", "test"}
    assert [c[0] for c in t["calls_ms"]["control"]] == t["control_ms"]
    # the positive control ran: a stall at every step of every control call (timed, and lead-in when control went
    # first), none in the A/A trials; checked by count, not by the clock
    steps = r["positive"]["steps"]
    assert all(t["stalls_ran"] >= 3 * steps and t["stalls_ran"] % steps == 0 for t in r["trials"]["positive"])
    assert all(t["stalls_ran"] == 0 for t in r["trials"]["aa"])
    assert "A/A false-positive rate" in (tmp_path / "wan__eager__tiny__cpu.md").read_text()
    again = lab_here(*base, "--trials", "2")  # refused before building anything
    assert again.returncode == 2 and "--replace" in again.stderr and "building" not in again.stderr
    other = lab_here(*base, "--trials", "3", "--resume", "--stall-ms", "2")
    assert other.returncode == 2 and "cannot be gone on from: its settings differ (stall_ms)" in other.stderr
    # with --replace as well (as a campaign passes them), afresh where it cannot go on
    assert cli.main([*base, "--trials", "1", "--resume", "--replace", "--stall-ms", "2"]) == 0
    assert "calibrating afresh (--replace)" in capfd.readouterr().err
    assert json.loads(path.read_text())["aa"]["trials"] == 1


@pytest.mark.slow
def test_every_trial_is_saved_as_it_completes():
    from lab.measure import ab
    from lab.measure.calibrate import CalibrationConfig, calibrate
    from lab.run.scenario import build, get_scenario

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    saved = []
    config = CalibrationConfig(trials=2, timing=ab.ABConfig(blocks=2, repeat=1, profile=False), stall_ms=1.0)
    outcome = calibrate(built, config, lambda _: None, save=saved.append)
    # after each trial (A/A, positive, A/A, positive) the file says how far it got, marked interrupted until the end
    assert [(s["aa"].trials, s["positive"].trials) for s in saved] == [(1, 0), (1, 1), (2, 1), (2, 2)]
    assert all(s["interrupted"] for s in saved) and not outcome["interrupted"]


def test_a_time_limit_stops_before_a_trial_that_would_end_past_it(monkeypatch):
    """Under a campaign's time limit (`LAB_DEADLINE`) no trial starts that would end past it (judged by the longest
    so far), and a trial whose blocks the limit stopped is left out, as a Ctrl-C's is: it stopped for no reason of the
    rule's."""
    import time

    from lab.measure import ab, blocks
    from lab.measure.calibrate import CalibrationConfig, calibrate
    from lab.run.scenario import build, get_scenario

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    config = CalibrationConfig(trials=5, timing=ab.ABConfig(blocks=2, repeat=1, profile=False), positive=False)
    monkeypatch.setattr(blocks, "DEADLINE_MARGIN_S", 0.0)
    monkeypatch.setenv("LAB_DEADLINE", f"{time.time() + 0.001:.3f}")  # past once the first trial is done
    said: list[str] = []
    outcome = calibrate(built, config, said.append)
    assert outcome["aa"].trials == 1 and outcome["interrupted"]  # a fixed design's blocks do not stop for it
    assert any("stopping before A/A trial 2: it would end past the time limit" in line for line in said)
    sequential = CalibrationConfig(trials=2, timing=ab.ABConfig(max_blocks=8, repeat=1, profile=False), positive=False)
    monkeypatch.setenv("LAB_DEADLINE", f"{time.time() + 0.001:.3f}")  # the first trial's blocks stop after one
    outcome = calibrate(built, sequential, said.append)
    assert outcome["aa"].trials == 0 and outcome["interrupted"]


def test_each_committed_calibration_page_is_its_typed_result():
    """Every committed calibration (both formats, every design) reads into its struct, and its page is what the
    struct gives."""
    from lab import results
    from lab.pages.calibration_report import markdown
    from lab.results.schema import CalibrationResult
    from tests.conftest import ROOT

    paths = [p for p in sorted((ROOT / "results").glob("**/*.json"))
             if json.loads(p.read_text()).get("kind") == "calibration"]
    assert len(paths) >= 7
    for path in paths:
        r = results.read(path)
        assert isinstance(r, CalibrationResult) and r.aa.trials == len(r.trials.aa), path
        # each page shows its plot: every trial's estimate and interval, and the A/A block ratios
        assert path.with_suffix(".png").exists(), f"{path.with_suffix('.png')} is missing: `lab table --redraw`"
        page = markdown(r, path.with_suffix(".png").name)
        assert path.with_suffix(".md").read_text() == page, f"{path.with_suffix('.md')} is stale"


def test_a_calibration_page_says_when_the_aa_blocks_break_what_alpha_rests_on():
    import msgspec

    from lab import results
    from lab.pages.calibration_report import markdown
    from tests.conftest import ROOT

    r = results.read(ROOT / "results" / "calibration" / "wan__eager__tiny__h200__processes.json")
    assert "none rejected at 0.01" in markdown(r) and "no evidence that the rate exceeds alpha" in markdown(r)
    # the same trials with the test arm 2 % slower in every block: one arm favoured
    slow = [msgspec.structs.replace(t, test_ms=[c * 1.02 for c in t.control_ms]) for t in r.trials.aa]
    page = markdown(msgspec.structs.replace(r, trials=msgspec.structs.replace(r.trials, aa=slow)))
    assert "**the blocks reject symmetry around 1" in page
    # as many false positives as trials: the count alone is evidence
    many = msgspec.structs.replace(r.aa, false_positives=r.aa.trials)
    assert "the count alone is evidence" in markdown(msgspec.structs.replace(r, aa=many))


def test_merge_adds_the_trials_of_a_run_that_went_on_from_the_same_ones(tmp_path):
    """Two device calls each resumed the committed 3 trials of the H100 cross-process calibration and added 6 (the
    second did not yet see the first's): split the committed file back into those two runs, merge them with the
    command, and get its 15 trials back, the second run's marked "b" and named on the page."""
    import msgspec

    from lab import results
    from lab.measure.calibrate import merge_trials
    from tests.conftest import ROOT

    committed = results.read(ROOT / "results/calibration/wan__eager__tiny__h100__processes.json")
    firsts = [t for t in committed.trials.aa if t.run is None]
    seconds = [msgspec.structs.replace(t, run=None) for t in committed.trials.aa if t.run == "b"]
    assert [t.trial for t in firsts] == list(range(9)) and [t.trial for t in seconds] == list(range(3, 9))
    runs = {}
    for name, trials in (("one", firsts), ("two", firsts[:3] + seconds)):
        runs[name] = tmp_path / name / "wan__eager__tiny__h100__processes.json"
        runs[name].parent.mkdir()
        r = msgspec.structs.replace(committed, trials=msgspec.structs.replace(committed.trials, aa=trials), note=None)
        results.write(runs[name], r)
    # the pure function: the shared trials once, the other run's own ones as run b
    merged, added = merge_trials(firsts, firsts[:3] + seconds)
    assert added == 6 and [(t.trial, t.run) for t in merged[9:]] == [(n, "b") for n in range(3, 9)]
    assert merge_trials(merged, firsts[:3] + seconds) == (merged, 0)  # merging again adds nothing
    proc = lab_here("calibrate", "--merge", str(runs["two"]), "--out", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 A/A and 0 positive trial(s) that" in proc.stderr
    r = results.read(runs["one"])
    assert r.aa.trials == 15 and r.aa.false_positives == 0 and r.interrupted  # 15 of the 40 asked for
    assert sorted((t.trial, t.run or "") for t in r.trials.aa) == sorted((t.trial, t.run or "") for t in committed.trials.aa)
    assert r.environment == committed.environment and r.command == committed.command  # the machine's, not this one's
    page = (tmp_path / "one" / "wan__eager__tiny__h100__processes.md").read_text()
    assert "Trials measured twice by number: A/A trials 3–8 of run b." in page
    assert "![each trial's estimate and interval, and the A/A block ratios](wan__eager__tiny__h100__processes.png)" in page
    assert drawn(tmp_path / "one" / "wan__eager__tiny__h100__processes.png")
    assert "Merged by `" in page and f"`: 6 A/A and 0 positive trial(s) from {runs['two']}." in page
    # refusals, one line each: a calibration of other settings, a file that is not there, --resume beside it
    other = msgspec.structs.replace(committed, config={**committed.config, "stall_ms": 2.0})
    results.write(tmp_path / "two" / "x.json", other)
    bad = lab_here("calibrate", "--merge", str(tmp_path / "two" / "x.json"), "--out", str(tmp_path / "one"),
                   "--name", "wan__eager__tiny__h100__processes")
    assert bad.returncode == 2 and "measured otherwise than" in bad.stderr and "its settings differ (stall_ms)" in bad.stderr
    missing = lab_here("calibrate", "--merge", str(runs["two"]), "--out", str(tmp_path / "none"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    both = lab_here("calibrate", "--merge", str(runs["two"]), "--resume")
    assert both.returncode == 2 and "leave out `--resume` and `--replace`" in both.stderr
    assert lab_here("calibrate").returncode == 2  # --pipeline is still required without --merge

"""The A/B engine end to end on CPU (tiny scenarios), its report files, tables and bad input."""

import dataclasses
import json
import shutil
from pathlib import Path

import msgspec
import pytest
import torch

from lab import results
from lab.apply.fix import each_sets, get_fix
from lab.base.errors import LabError
from lab.campaigns import campaign
from lab.measure import ab, blocks, cell, profiles
from lab.results.states import RESUMABLE
from lab.pages import table
from lab.results import going_on, store
from lab.results.schema import ABResult, replace
from lab.run.runner import CompileSpec
from lab.run.scenario import build, get_scenario
from lab.verdicts.verdict import Verdict
from tests.conftest import ROOT, ctrl_c_at, drawn, lab, lab_here

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unipc_result(tmp_path_factory):
    """`lab ab` as a user runs it, in a process of its own: its terminal output is checked as well as its files.
    Two profiled calls per arm, not the default three (`test_three_profiled_calls_per_arm_by_default`): each costs
    seconds, and two already take both orders of the pair and a median of several."""
    out = tmp_path_factory.mktemp("ab")
    proc = lab("ab", "--fix", "unipc_stack", "--pipeline", "wan", "--blocks", "6", "--repeat", "1",
               "--profile-calls", "2", "--out", str(out), "--trace-dir", str(out / "traces"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = out / "wan" / "unipc_stack__eager__tiny__cpu.json"
    return out, path, json.loads(path.read_text()), proc


def test_result_file_has_samples_environment_and_verdict(unipc_result):
    out, path, r, proc = unipc_result
    assert r["format"] == results.FORMAT_VERSION and r["kind"] == "ab"
    assert r["verify"]["identical"] and r["verify"]["exercised"]["unipc_stack"] == 7  # 4 predictor + 3 corrector
    assert len(r["samples"]["control"]["wall_ms"]) == len(r["samples"]["test"]["wall_ms"]) == 6
    # stored as the verdict's value ("equivalent"; its page says "equivalent within ±1%"): whichever the noise decides
    assert Verdict(r["verdict"]) in (Verdict.FASTER, Verdict.SLOWER, Verdict.UNDECIDED, Verdict.EQUIVALENT)
    assert r["stats"]["design"]["kind"] == "fixed" and r["stats"]["n"] == 6
    assert r["environment"]["diffusers"] == "0.37.1" and r["environment"]["torch"]
    assert r["environment"]["accelerate"] == "1.15.0"  # whose hooks model offloading runs: the pinned release
    assert "diffusers 0.37.1, accelerate 1.15.0, lab " in path.with_suffix(".md").read_text()
    assert r["command"].startswith("lab ab --fix unipc_stack")
    # the host-side effect on CPU: UniPC's per-element .item() copies are gone
    reads = r["profile"]["metrics"]["host_scalar_reads"]
    assert reads["test"] < reads["control"]
    # two profiled calls per arm (as asked), each to a trace of its own; the metrics are their medians
    assert r["profile"]["calls"] == r["profile"]["calls_wanted"] == 2
    assert all(len(set(v)) == 2 for v in r["profile"]["all_traces"].values())
    assert all(Path(t).exists() for v in r["profile"]["all_traces"].values() for t in v)
    assert path.with_suffix(".md").exists() and drawn(path.with_suffix(".png"))
    assert "host scalar reads" in proc.stdout
    # the pipelines' progress bars and the profiler's chatter go to a log beside the traces, not to the terminal
    log = out / "traces" / "wan_unipc_stack__eager__tiny__cpu.log"
    assert "%|" not in proc.stderr + proc.stdout and "%|" in log.read_text()
    assert "(pipeline and profiler output, " in proc.stderr and str(log) in proc.stderr


def test_three_profiled_calls_per_arm_by_default():
    from lab.cli import build_parser
    from lab.commands._shared import ab_config

    args = build_parser("ab").parse_args(["ab", "--fix", "unipc_stack", "--pipeline", "wan"])
    assert ab_config(args).profile and ab_config(args).profile_calls == 3


def test_sequential_blocks_stop_at_the_first_decision():
    built = build(get_scenario("wan"), size="tiny", device="cpu")
    arms = [ab.Arm("control", [], hook=ab.injected_stall("cpu", 5.0)), ab.Arm("test", [])]
    lines = []
    bench = blocks.benchmark(built, arms, ab.ABConfig(max_blocks=30, repeat=1, profile=False), lines.append)
    n = len(bench["samples"]["control"]["wall_ms"])
    assert bench["stopped"] == "decided" and 8 <= n < 30  # 8 blocks is the first look that can decide (all agree)
    assert bench["looks"][-1]["verdict"].startswith("faster") and bench["looks"][0]["n"] == 6
    assert [lk["n"] for lk in bench["looks"]] == list(range(6, n + 1))
    assert lines[-1].startswith(f"  block {n}/30: ") and "faster" in lines[-1]
    assert all(line.startswith("\r") for line in lines[:-1])  # one status line that the next overwrites
    firsts = [o[0] for o in bench["order"]]
    assert abs(firsts.count("control") - firsts.count("test")) <= 1  # balanced whenever it stops
    assert bench["design"]["kind"] == "sequential" and bench["design"]["alpha_look"] < 0.05


def test_a_budget_stops_a_sequential_run_undecided():
    built = build(get_scenario("wan"), size="tiny", device="cpu")
    same = [ab.Arm("control", []), ab.Arm("test", [])]
    said: list[str] = []
    bench = blocks.benchmark(built, same, ab.ABConfig(max_blocks=40, repeat=1, budget_s=0.5, profile=False), said.append)
    assert bench["stopped"] == "budget spent" and 1 <= len(bench["block_s"]) < 40
    assert sum(bench["block_s"]) <= 0.5 + max(bench["block_s"])
    # after its first block the run says whether its budget can reach the rule's first call of a change (8 blocks)
    warned = [m for m in said if "budget of" in m]
    assert len(warned) == (max(1, int(0.5 // bench["block_s"][0])) < 8)
    assert all(m.startswith("  warning: at ") and "to call a change faster or slower" in m for m in warned)


def test_bad_timing_options_are_one_line_each():
    for args, message in ((("--blocks", "0"), "`--blocks` must be at least 1."),
                          (("--min-blocks", "12", "--max-blocks", "8"), "`--min-blocks 12` is more than"),
                          (("--budget", "ten"), "expected a positive time such as 90s"),
                          (("--blocks", "8", "--budget", "5m"), "a fixed design (`--blocks N`) runs all its blocks")):
        proc = lab_here("ab", "--fix", "unipc_stack", "--pipeline", "wan", *args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_existing_result_is_not_overwritten(unipc_result):
    out, _, _, _ = unipc_result
    proc = lab_here("ab", "--fix", "unipc_stack", "--pipeline", "wan", "--blocks", "6", "--out", str(out))
    assert proc.returncode == 2 and "--replace" in proc.stderr


def test_an_interrupted_replace_keeps_the_result_it_was_to_replace(unipc_result, tmp_path, monkeypatch):
    from lab import cli

    out, path, before, _ = unipc_result
    folder = tmp_path / "ab"
    shutil.copytree(out / "wan", folder / "wan")
    ctrl_c_at(monkeypatch, 8)  # after the first complete block
    cli.main(["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--blocks", "6", "--repeat", "1", "--no-profile",
              "--replace", "--out", str(folder), "--trace-dir", str(tmp_path / "traces")])
    assert json.loads((folder / "wan" / path.name).read_text()) == before  # kept as it was
    aside = json.loads((tmp_path / "traces" / "interrupted" / "wan" / path.name).read_text())
    assert aside["interrupted"] and 1 <= aside["stats"]["n"] < 6


def test_ctrl_c_in_one_fix_set_stops_the_command(tmp_path, monkeypatch, capsys):
    from lab import cli

    ctrl_c_at(monkeypatch, 8)  # in the first set's blocks
    code = cli.main(["ab", "--fix", "hook_registry_cache", "--fix", "no_progress_bar", "--pipeline", "flux",
                     "--blocks", "6", "--repeat", "1", "--no-profile", "--out", str(tmp_path / "ab"),
                     "--trace-dir", str(tmp_path / "traces")])
    assert code == 130
    written = sorted(p.name for p in (tmp_path / "ab" / "flux").glob("*.json"))
    assert written == ["hook_registry_cache__eager__tiny__cpu.json"]  # its complete blocks kept; the next set not run
    assert json.loads((tmp_path / "ab" / "flux" / written[0]).read_text())["stopped"] == "interrupted"
    assert "not run: no_progress_bar" in capsys.readouterr().err


def test_resume_goes_on_from_the_blocks_of_an_undecided_run(tmp_path, monkeypatch):
    from lab import cli

    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8", "--no-profile",
            "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]
    real = ctrl_c_at(monkeypatch, 17)  # in the third block or so
    cli.main(argv)
    monkeypatch.setattr(ab, "timed_call", real)
    path = tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    first = json.loads(path.read_text())
    k = len(first["order"])
    assert first["stopped"] == "interrupted" and 1 <= k < 6

    cli.main(argv + ["--resume"])
    went_on = json.loads(path.read_text())
    n = len(went_on["order"])
    assert n > k and went_on["stopped"] in ("decided", "max blocks") and went_on["stats"]["n"] == n
    for arm in ("control", "test"):  # the earlier blocks, as they were, then this run's
        assert went_on["samples"][arm]["raw_wall_ms"][:k] == first["samples"][arm]["raw_wall_ms"]
    # the counterbalanced order goes on where it stopped: as if one run had measured every block
    assert [o[0] == "test" for o in went_on["order"]] == [bool(f) for f in blocks.first_arms(8, 2, 0)[:n]]
    assert [s["blocks"] for s in went_on["segments"]] == [k, n - k]
    assert [s["stopped"] for s in went_on["segments"]] == ["interrupted", went_on["stopped"]]
    assert [lk["n"] for lk in went_on["looks"]] == list(range(6, n + 1))
    assert "measured in 2 runs" in path.with_suffix(".md").read_text()

    again = lab_here("ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8",
                     "--no-profile", "--out", str(tmp_path / "ab"), "--resume")  # refused before building
    assert again.returncode == 2 and "cannot go on" in again.stderr and "Traceback" not in again.stderr
    assert json.loads(path.read_text()) == went_on


def test_a_campaigns_time_limit_stops_the_blocks_cleanly_and_the_run_can_go_on(monkeypatch):
    """`LAB_DEADLINE` (set by `lab campaign run --time-limit` for its jobs): a sequential run starts no block that would
    end past it, less the time to write, and stops "time limit", a stop it can go on from; no deadline, no stop."""
    import time

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    same = [ab.Arm("control", []), ab.Arm("test", [])]
    config = ab.ABConfig(max_blocks=40, repeat=1, profile=False)
    monkeypatch.setattr(blocks, "DEADLINE_MARGIN_S", 0.0)
    monkeypatch.setenv("LAB_DEADLINE", f"{time.time() + 0.001:.3f}")  # past once the first block is done
    said: list[str] = []
    bench = blocks.benchmark(built, same, config, said.append)
    assert bench["stopped"] == "time limit" and len(bench["block_s"]) == 1 and not bench["interrupted"]
    assert "stopping before block 2: the next would end past the campaign's time limit" in said[-1]
    assert "time limit" in RESUMABLE
    monkeypatch.setenv("LAB_DEADLINE", "not a time")  # ignored, as no deadline
    assert blocks.time_limit() is None
    monkeypatch.delenv("LAB_DEADLINE")
    assert blocks.benchmark(built, same, ab.ABConfig(blocks=2, repeat=1, profile=False), said.append)["stopped"] == "blocks done"


def test_a_set_stopped_at_a_campaigns_time_limit_ends_the_command_and_names_the_sets_not_run(tmp_path, monkeypatch):
    """With several fix sets, one stopped at the campaign's time limit ends the command (exit 130, as a job stopped
    at the limit): the next set would only warm up and verify past the limit (on four H200s, 2026-11-28, a job was
    still verifying its next set when the host's own limit came). The stopped set keeps its result, to go on from."""
    import time

    monkeypatch.setenv("LAB_DEADLINE", f"{time.time() + 1:.3f}")  # no block fits before it
    out = tmp_path / "ab"
    proc = lab_here("ab", "--fix", "unipc_stack", "--fix", "begin_index", "--pipeline", "wan", "--repeat", "1",
                    "--max-blocks", "8", "--profile-calls", "1", "--out", str(out), "--trace-dir", str(tmp_path / "t"))
    assert proc.returncode == 130, proc.stderr[-2000:]
    stopped = json.loads((out / "wan" / "unipc_stack__eager__tiny__cpu.json").read_text())
    assert stopped["stopped"] == "time limit" and not stopped["order"]
    assert not (out / "wan" / "begin_index__eager__tiny__cpu.json").exists()
    assert "the campaign's time limit: not run: begin_index (the next run goes on from here)" in proc.stderr


def test_a_run_that_goes_on_keeps_the_profiles_of_the_run_it_goes_on_from(tmp_path, monkeypatch):
    """Profiling the same code again would cost minutes at a slow call (a 28 s Wan call profiles for 8 min): a run
    that goes on from another's blocks keeps that run's paired profiles and takes none."""
    from lab import cli

    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8",
            "--profile-calls", "1", "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]
    real = ctrl_c_at(monkeypatch, 17)
    cli.main(argv)
    monkeypatch.setattr(ab, "timed_call", real)
    path = tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    first = json.loads(path.read_text())
    assert first["stopped"] == "interrupted" and first["profile"]["metrics"]["syncs"]

    def profiled_again(*args, **kwargs):
        raise AssertionError("the run that went on profiled again")

    monkeypatch.setattr(ab, "paired_profiles", profiled_again)
    assert cli.main(argv + ["--resume"]) == 0
    went_on = json.loads(path.read_text())
    assert len(went_on["order"]) > len(first["order"]) and went_on["profile"] == first["profile"]
    assert "phase_s" in went_on and "profile" not in went_on["phase_s"]
    # what the profiles took travels with them (a campaign plans the next profiled pair from it)
    assert went_on["profile"]["seconds"] == first["phase_s"]["profile"] > 0


def test_a_compiled_run_going_on_keeps_the_verification_where_the_warm_up_alone_compiled_what_the_blocks_run(
        tmp_path, monkeypatch):
    """Compiled, a run going on from a result whose verifying calls compiled nothing keeps its verification rather
    than make it again (Qwen-Image's compiled group-offload cells spent 127 s of a lent call verifying again before
    a 200 s block, and could never time one); the run after that keeps it too where nothing compiled after its
    warm-up. Eager, the verifying call ends each arm's warm-up: verified again."""
    from lab import cli

    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--mode", "compile", "--compile-backend", "eager",
            "--repeat", "1", "--max-blocks", "12", "--no-profile", "--out", str(tmp_path / "ab"),
            "--trace-dir", str(tmp_path / "traces")]
    real = ctrl_c_at(monkeypatch, 12)  # in the second block or so
    cli.main(argv)
    path = tmp_path / "ab" / "wan" / "unipc_stack__compile__tiny__cpu.json"
    first = json.loads(path.read_text())
    assert first["stopped"] == "interrupted" and first["order"]
    assert first["compilation"]["verify"]["compilations"] == 0 and first["verify"]["kept_from"] is None
    assert first["verify"]["seconds"] == first["phase_s"]["verify"] > 0

    def verified_again(*args, **kwargs):
        raise AssertionError("the run that went on verified again")

    monkeypatch.setattr(ab, "verify", verified_again)
    for _ in range(2):  # the second goes on from a run that kept its verification
        ctrl_c_at(monkeypatch, 8)
        cli.main(argv + ["--resume"])
        monkeypatch.setattr(ab, "timed_call", real)
        went_on = json.loads(path.read_text())
        assert len(went_on["order"]) > len(first["order"]) and went_on["stopped"] == "interrupted"
        assert went_on["verify"] == {**first["verify"], "kept_from": first["created"]}
        assert "verify" not in went_on["phase_s"] and went_on["phase_s"]["call"] == first["phase_s"]["call"]
        assert went_on["compilation"]["verify"] is None and went_on["compilation"]["steady"]["compilations"] == 0
        page = path.with_suffix(".md").read_text()
        assert f"kept from the run of {first['created']}" in page
        first = {**went_on, "verify": first["verify"], "created": first["created"]}

    # where the verifying calls compiled something, or eager, or where something compiled after a kept one's warm-up
    result = store.read(path)
    assert going_on.kept_verification(result) is not None
    for changed in ({"compilation": {**result.compilation, "steady": {"compilations": 1}}},
                    {"mode": "eager"}, {"verify": msgspec.structs.replace(result.verify, exercised={})}):
        assert going_on.kept_verification(msgspec.structs.replace(result, **changed)) is None
    made = msgspec.structs.replace(result, verify=msgspec.structs.replace(result.verify, kept_from=None))
    assert going_on.kept_verification(msgspec.structs.replace(
        made, compilation={**result.compilation, "verify": {"compilations": 2, "recompiles": 0}})) is None


def test_profile_pairs_that_fit_before_a_time_limit():
    pair = 2 * profiles.PROFILED_CALL_FACTOR * 20.0 + profiles.ANALYSIS_S_PER_PAIR  # a 20 s call (model CPU offload)
    assert profiles.profile_pairs_that_fit(3, 20.0, None) == 3  # no limit: as many as asked
    assert profiles.profile_pairs_that_fit(3, 20.0, blocks.DEADLINE_MARGIN_S + 100.0 + 2 * pair + 1, block_s=100.0) == 2
    assert profiles.profile_pairs_that_fit(3, 20.0, blocks.DEADLINE_MARGIN_S + 100.0 + 2 * pair - 1, block_s=100.0) == 1
    assert profiles.profile_pairs_that_fit(3, 20.0, 10 * pair) == 3
    assert profiles.profile_pairs_that_fit(3, 20.0, blocks.DEADLINE_MARGIN_S + pair) == 1  # one alone, no block after it
    # none where one pair alone ends past the limit (Flux2 Klein's 82 s call, 125 s left): the run keeps its call time
    assert profiles.profile_pairs_that_fit(3, 81.9, 125.0) == 0
    assert profiles.profile_pairs_that_fit(3, 20.0, blocks.DEADLINE_MARGIN_S + pair - 1) == 0
    assert profiles.profile_pairs_that_fit(0, 1.0, None) == 1


def test_a_run_whose_first_profiled_pair_would_end_past_the_limit_takes_none_and_keeps_its_call_time(tmp_path,
                                                                                                      monkeypatch):
    """Flux2 Klein in group offloading took its one profiled pair (an 82 s call, 125 s left) and was cut off in it in
    five device calls running, none of which left its campaign a call time: now no pair starts that would end past
    the limit, and the result keeps the plain call's time (`phase_s["call"]`), which the campaign plans from."""
    import time

    from lab import cli

    monkeypatch.setattr(ab, "time_limit", lambda: time.time() + blocks.DEADLINE_MARGIN_S + 5.0)  # 5 s: no pair fits
    said: list[str] = []
    monkeypatch.setattr(ab, "paired_profiles", lambda *a, **k: said.append("profiled") or {})
    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "6", "--out",
            str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]
    assert cli.main(argv) == 0
    result = json.loads((tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json").read_text())
    assert not said and result["profile"] is None and "profile" not in result["phase_s"]
    assert 0 < result["phase_s"]["call"] < result["phase_s"]["verify"]


def test_a_time_limit_before_the_first_block_stops_on_the_estimate_from_the_calls(monkeypatch):
    """No block measured yet: the estimate from the calls so far says whether the first one ends before the limit."""
    import time

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    same = [ab.Arm("control", []), ab.Arm("test", [])]
    monkeypatch.setenv("LAB_DEADLINE", f"{time.time() + 3600:.3f}")
    said: list[str] = []
    bench = blocks.benchmark(built, same, ab.ABConfig(max_blocks=40, repeat=1, profile=False), said.append,
                         first_block_s=7200.0)
    assert bench["stopped"] == "time limit" and not bench["block_s"] and not bench["interrupted"]
    assert "stopping before block 1" in said[-1]
    verdict = ab.judge(bench["samples"], bench["order"], design=ab.ABConfig().design(), margin=0.01,
                       stopped=bench["stopped"])
    assert verdict["verdict"] is Verdict.NO_DATA and verdict["summary"] == (
        "the time limit came before the first block could end")


def test_a_run_interrupted_in_its_profiles_keeps_its_pairs_and_goes_on_from_them(tmp_path, monkeypatch):
    """Flux2 Klein in group offloading (calls of tens of seconds) was cut off by the device's time limit in its profiles
    in two device calls running, keeping nothing: the pairs complete by then are kept, the result (no block yet) is
    owed by a campaign, and the run that goes on keeps those profiles and times blocks."""
    from lab import cli

    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8",
            "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]
    real, calls = ab.profile_call, []

    def cut_off(*args, **kwargs):  # the third profiled call, the first of the second pair, is interrupted
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ab, "profile_call", cut_off)
    assert cli.main(argv) == 130
    path = tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    first = json.loads(path.read_text())
    assert first["profile"]["calls"] == 1 and first["profile"]["calls_wanted"] == 3 and first["profile"]["cut_short"]
    assert first["stopped"] == "interrupted" and first["verdict"] == "no data" and not first["order"]
    assert first["profile"]["metrics"]["host_scalar_reads"]["test"] < first["profile"]["metrics"]["host_scalar_reads"]["control"]
    assert ("rest on 1 profiled call(s) per arm of the 3 asked for: the run was interrupted in its profiles"
            in path.with_suffix(".md").read_text())

    # a campaign owes the cell, and goes on from its profiles (`lab ab --resume`)
    plan = tmp_path / "c.toml"
    plan.write_text('[campaign]\ndevice = "cpu"\n[[cell]]\npipeline = "wan"\nsize = "tiny"\nmode = "eager"\n'
                    'fix = "unipc_stack"\nrepeat = 1\nmax_blocks = 8\n')
    proc = lab_here("campaign", "plan", str(plan), "--results", str(tmp_path), "--json")
    (cell,) = json.loads(proc.stdout)["cells"]
    assert cell["state"] == "planned" and cell["detail"].startswith("stopped before its first block"), cell
    proc = lab_here("campaign", "run", str(plan), "--results", str(tmp_path), "--dry-run")
    assert proc.returncode == 0 and "--resume --replace" in proc.stdout, proc.stdout + proc.stderr

    def profiled_again(*args, **kwargs):
        raise AssertionError("the run that went on profiled again")

    monkeypatch.setattr(ab, "paired_profiles", profiled_again)
    assert cli.main(argv + ["--resume"]) == 0
    went_on = json.loads(path.read_text())
    assert went_on["order"] and went_on["profile"] == first["profile"] and "profile" not in went_on["phase_s"]
    assert [s["blocks"] for s in went_on["segments"]] == [len(went_on["order"])]  # no segment of no blocks


def test_a_time_limit_after_the_profiled_pair_keeps_it_for_the_run_that_goes_on(tmp_path, monkeypatch):
    """A campaign's first run of a slow cell may have time for its profiled pair and not for a block (what `lab
    campaign` now counts as its shortest useful run): it stops cleanly before the first block, its result keeps the
    pair (owed, "no blocks yet"), and the run that goes on times blocks without profiling again."""
    import time

    from lab import cli

    deadline = time.time() + blocks.DEADLINE_MARGIN_S  # no block can end before it
    monkeypatch.setattr(ab, "time_limit", lambda: deadline)
    monkeypatch.setattr(blocks, "time_limit", lambda: deadline)
    monkeypatch.setattr(ab, "profile_pairs_that_fit", lambda *a, **k: 1)  # one pair fits (its arithmetic: above)
    argv = ["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8",
            "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]
    assert cli.main(argv) == 0
    path = tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    first = json.loads(path.read_text())
    assert first["stopped"] == "time limit" and not first["order"] and first["profile"]["calls"] == 1, first["stopped"]
    assert results.read(path).profiles_only

    def profiled_again(*args, **kwargs):
        raise AssertionError("the run that went on profiled again")

    monkeypatch.setattr(ab, "time_limit", lambda: None)
    monkeypatch.setattr(blocks, "time_limit", lambda: None)
    monkeypatch.setattr(ab, "paired_profiles", profiled_again)
    assert cli.main(argv + ["--resume"]) == 0
    went_on = json.loads(path.read_text())
    assert went_on["order"] and went_on["profile"] == first["profile"]


def test_resume_says_when_there_is_nothing_to_go_on_from_or_the_stored_result_is_damaged(tmp_path, capfd):
    from lab import cli

    args = ("ab", "--fix", "no_progress_bar", "--pipeline", "flux", "--blocks", "1", "--repeat", "1", "--warmup", "0",
            "--no-profile", "--out", str(tmp_path), "--trace-dir", str(tmp_path / "traces"), "--resume")
    assert cli.main(list(args)) == 0  # in this process (what it says is all this test reads), its output captured
    path = tmp_path / "flux" / "no_progress_bar__eager__tiny__cpu.json"
    assert f"nothing stored at {path} to go on from: running it afresh" in capfd.readouterr().err and path.exists()
    path.write_text(path.read_text()[:200])  # cut off
    damaged = lab_here(*args)  # refused before building
    assert damaged.returncode == 2 and "Full traceback" not in damaged.stderr
    assert f"{path} cannot go on: the stored result cannot be read ({path}: not a readable result file" in damaged.stderr
    assert "Pass --replace to run it afresh" in damaged.stderr


def test_what_keeps_a_result_from_going_on():
    config = ab.ABConfig(max_blocks=8, repeat=1)
    environment = {"gpu": "none (CPU)", "torch": "2.13.0", "diffusers": "0.37.1", "cuda": None}
    identity = {"scenario": "wan", "size": "tiny", "layers": None, "steps": 4, "mode": "eager", "fixes": ["unipc_stack"],
                "base": [], "control": "off", "isolated": False, "patches": None, "diffusers": None}
    previous = msgspec.convert({**identity, "name": "x", "created": "", "command": "lab ab", "stopped": "budget spent",
                                "verdict": "undecided", "samples": {"control": {"wall_ms": [1.0]}, "test": {"wall_ms": [1.0]}},
                                "design": config.design().to_dict(), "config": dataclasses.asdict(config),
                                "environment": environment}, ABResult)
    current = {**identity, "environment": environment}
    assert cell.resume_problems(previous, current, config) == []
    assert cell.resume_problems(previous, current, dataclasses.replace(config, repeat=2)) == [
        "`--repeat` was 1, now 2"]
    assert "--max-blocks" in cell.resume_problems(previous, current, dataclasses.replace(config, max_blocks=9))[0]
    assert cell.resume_problems(previous, {**current, "fixes": ["unipc_device_const"]}, config) == [
        "fixes was ['unipc_stack'], now ['unipc_device_const']"]
    assert cell.resume_problems(previous, {**current, "environment": {**environment, "torch": "2.12.0"}}, config) == [
        "torch was 2.13.0, now 2.12.0"]
    assert "fixed design" in cell.resume_problems(previous, current, dataclasses.replace(config, blocks=8))[0]
    assert "decided already" in cell.resume_problems(replace(previous, stopped="decided"), current, config)[0]
    assert "most blocks" in cell.resume_problems(replace(previous, stopped="max blocks"), current, config)[0]


def test_order_is_counterbalanced(unipc_result):
    _, _, r, _ = unipc_result
    firsts = [o[0] for o in r["order"]]
    assert firsts.count("control") == firsts.count("test") == 3


def test_not_exercised_verdict():
    built = build(get_scenario("qwenimage"), size="tiny", device="cpu")
    config = ab.ABConfig(blocks=6, repeat=1, profile=False)
    r = ab.run(built, CompileSpec(), ab.Arm("control", []), ab.Arm("test", [get_fix("qwen_modulate_index")]), config,
               Path("unused"), "x", lambda _: None)
    assert r["verdict"] is Verdict.NOT_EXERCISED and r["verify"]["exercised"] == {"qwen_modulate_index": 0}
    # the verdict needs one block, and more would time a difference no fix made: it stops there
    assert len(r["order"]) == 1 and r["stopped"] == "not exercised", (r["order"], r["stopped"])
    # a sequential design too (it would time up to its most blocks), and it takes no profiles
    config = ab.ABConfig(min_blocks=6, max_blocks=40, repeat=1, profile=True)
    r = ab.run(built, CompileSpec(), ab.Arm("control", []), ab.Arm("test", [get_fix("qwen_modulate_index")]), config,
               Path("unused"), "x", lambda _: None)
    assert r["verdict"] is Verdict.NOT_EXERCISED and len(r["order"]) == 1 and "profile" not in r, r.keys()


def test_exercised_with_zero_cond_t():
    built = build(get_scenario("qwenimage_zero_cond"), size="tiny", device="cpu")
    config = ab.ABConfig(blocks=6, repeat=1, profile=False)
    r = ab.run(built, CompileSpec(), ab.Arm("control", []), ab.Arm("test", [get_fix("qwen_modulate_index")]), config,
               Path("unused"), "x", lambda _: None)
    assert r["verdict"] is not Verdict.NOT_EXERCISED and r["verify"]["exercised"]["qwen_modulate_index"] == 8
    assert len(r["order"]) == 6 and r["stopped"] == "blocks done"  # its blocks all timed
    assert r["verify"]["identical"]


def test_interrupt_keeps_complete_blocks(monkeypatch):
    built = build(get_scenario("wan"), size="tiny", device="cpu")
    ctrl_c_at(monkeypatch, 8)  # in the third block (3 calls per block: a lead-in and one timed call per arm)
    bench = blocks.benchmark(built, [ab.Arm("control", []), ab.Arm("test", [])], ab.ABConfig(blocks=5, repeat=1), lambda _: None)
    assert bench["interrupted"] and len(bench["samples"]["control"]["wall_ms"]) == 2


def test_fix_for_another_pipeline_and_all():
    proc = lab_here("ab", "--fix", "qwen_modulate_index", "--pipeline", "wan")
    assert proc.returncode == 2 and "does not apply to the `wan` pipeline" in proc.stderr
    proc = lab_here("ab", "--fix", "unipc_stak", "--pipeline", "wan")
    assert proc.returncode == 2 and "Did you mean `unipc_stack`?" in proc.stderr
    proc = lab_here("ab", "--fix", "unipc_stack", "--pipeline", "wan", "--profile-calls", "0")
    assert proc.returncode == 2 and "`--profile-calls` must be at least 1." in proc.stderr


def test_table_from_results(unipc_result, tmp_path):
    out, path, r, _ = unipc_result
    results_dir = tmp_path / "results"
    (results_dir / "ab").mkdir(parents=True)
    shutil.copytree(out / "wan", results_dir / "ab" / "wan")
    text = table.generate(results_dir)
    assert "## wan — none (CPU), eager, tiny, 4 steps" in text
    assert "[unipc_stack](ab/wan/unipc_stack__eager__tiny__cpu.md) before" in text
    assert "| host scalar reads |" in text and f"**{results.read(path).verdict_text}**" in text


def test_mixed_environments_need_the_flag(unipc_result, tmp_path):
    _, path, r, _ = unipc_result
    other = json.loads(json.dumps(r))
    other["environment"]["torch"] = "9.9.9"
    other["name"] = "other"
    with pytest.raises(LabError, match="environment torch is different"):
        results.check_compatible(r, other)
    results.check_compatible(r, other, allow=True)


def test_committed_results_readme_is_current():
    committed = (ROOT / "results" / "README.md").read_text()
    campaigns = campaign.states(ROOT / "campaigns", ROOT / "results")
    assert committed == table.generate(ROOT / "results", campaigns=campaigns), "results/README.md is stale: run `lab table`"
    pages = table.result_pages(ROOT / "results")
    kinds = {"ab": "*/*.json", "sweep": "*/*.json", "history": "*.json", "census": "*.json", "settings-map": "*.json"}
    census_tables = {p.stem.split("__", 1)[1] for p in (ROOT / "results" / "census").glob("*.json")}
    calibrations = sum(len(results.all_results(ROOT / "results" / where, kind="calibration"))
                       for where in ("calibration", "parallel"))
    assert len(pages) == sum(len(list((ROOT / "results" / kind).glob(pattern))) for kind, pattern in kinds.items()) \
        + len(census_tables) + calibrations
    stale = [p.name for p, text in pages.items() if p.read_text() != text]
    assert not stale, f"result pages are stale: run `lab table` ({', '.join(stale)})"


def test_isolated_arms_in_their_own_processes(tmp_path):
    """The arms' worker processes are real processes; the command that runs them is `lab.cli.main` in this one (a
    process of its own would only import torch and diffusers again)."""
    from lab import cli

    code = cli.main(["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--isolate", "--blocks", "1", "--repeat", "1",
                     "--profile-calls", "2", "--out", str(tmp_path), "--trace-dir", str(tmp_path / "traces")])
    assert code == 0
    r = json.loads((tmp_path / "wan" / "unipc_stack__eager__tiny__cpu.json").read_text())
    assert r["isolated"] and r["verify"]["identical"] and r["verify"]["exercised"]["unipc_stack"] == 7
    assert len(r["samples"]["test"]["wall_ms"]) == 1
    # a fresh pair of workers for each block (the default), besides the pair that verified and profiled
    assert r["workers"] == {**r["workers"], "design": "fresh pair per block", "pairs": 1, "processes": 4}
    reads = r["profile"]["metrics"]["host_scalar_reads"]
    assert reads["test"] < reads["control"]
    # two profiled calls per arm in the workers (as asked), each to a trace of its own; the metrics are their medians
    assert r["profile"]["calls"] == 2 and all(len(set(v)) == 2 for v in r["profile"]["all_traces"].values())
    assert all(Path(t).exists() for v in r["profile"]["all_traces"].values() for t in v)


def test_each_fix_alone_and_all_together_on_one_build(tmp_path, monkeypatch, capfd):
    """In this process (`lab.cli.main`, from `tmp_path`, where its logs go; what it says read from file descriptor
    2): a process of its own would only import torch and diffusers again."""
    from lab import cli

    args = ("ab", "--fix", "each", "--pipeline", "flux", "--blocks", "1", "--repeat", "1", "--warmup", "0", "--no-profile",
            "--out", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(list(args)) == 0
    assert capfd.readouterr().err.count("building flux") == 1
    written = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "flux").glob("*.json")}
    assert {r["name"]: r["fixes"] for r in written.values()} == {
        "hook_registry_cache__eager__tiny__cpu": ["hook_registry_cache"],
        "no_progress_bar__eager__tiny__cpu": ["no_progress_bar"],
        "hook_registry_cache+no_progress_bar__eager__tiny__cpu": ["hook_registry_cache", "no_progress_bar"]}
    assert written["no_progress_bar__eager__tiny__cpu"]["notes"] == []  # the `all` notes go with the joint set only
    assert any("does not apply" in n for n in written["hook_registry_cache+no_progress_bar__eager__tiny__cpu"]["notes"])
    # a second run keeps what exists (so a cut-off campaign resumes) and builds nothing
    again = lab_here(*args)
    assert again.returncode == 0 and again.stderr.count("kept ") == 3 and "building" not in again.stderr
    assert lab_here(*args, "--name", "x").returncode == 2


def test_each_leaves_conflicting_fixes_out_of_the_joint_set():
    from lab.commands.ab import fix_sets

    sets = fix_sets(get_scenario("wan"), ["each"])
    alone = [fixes[0].name for fixes, _ in sets[:-1]]
    assert "unipc_stack" in alone and "unipc_host_coeffs" in alone
    joint, notes = sets[-1]
    assert "unipc_host_coeffs" in [f.name for f in joint] and "unipc_stack" not in [f.name for f in joint]
    assert any("cannot be applied together" in n for n in notes)



def test_a_failure_inside_the_pipeline_is_one_line_and_a_traceback_file(monkeypatch, capsys):
    from lab import cli
    from lab.commands import run as run_command

    def broken(args):
        raise ValueError("The `hidden_states` sequence length 16 should be divisible by 128")

    monkeypatch.setattr(run_command, "run", broken)
    monkeypatch.delenv("LAB_TRACEBACK", raising=False)
    assert cli.main(["run", "--pipeline", "ltx2"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("ERROR: ValueError: The `hidden_states`")
    assert "test_ab.py" in err  # where it was raised
    path = Path(err.split("Full traceback: ")[1].split(" (or set")[0])
    assert "Traceback (most recent call last)" in path.read_text()
    path.unlink()
    monkeypatch.setenv("LAB_TRACEBACK", "1")
    assert cli.main(["run", "--pipeline", "ltx2"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_coverage_is_the_state_of_the_coverage_campaign(unipc_result, tmp_path):
    _, path, r, _ = unipc_result
    campaigns = tmp_path / "campaigns"
    campaigns.mkdir()
    (campaigns / "coverage.toml").write_text('[campaign]\ndescription = "wan on the GPU"\n[[cell]]\npipeline = "wan"\n'
                                             'fix = "each"\nmode = ["eager", "compile"]\n')
    results_dir = tmp_path / "results"
    gpu = json.loads(json.dumps(r))
    gpu["environment"].update(device="cuda", gpu="NVIDIA H200")
    target = results_dir / "ab" / "wan" / "unipc_stack__eager__tiny__h200.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(gpu))
    # the campaign's cells are at size full: this tiny result is another cell, so nothing is measured yet
    lines = table.coverage_table(results_dir, campaign.states(campaigns, results_dir))
    assert "| wan | unipc_stack | *planned* | *planned* |" in lines
    (campaigns / "coverage.toml").write_text('[campaign]\ndescription = "wan"\n[defaults]\nsize = "tiny"\n'
                                             '[[cell]]\npipeline = "wan"\nfix = "each"\nmode = ["eager", "compile"]\n')
    lines = table.coverage_table(results_dir, campaign.states(campaigns, results_dir))
    row = next(line for line in lines if line.startswith("| wan | unipc_stack |"))
    short = table.short(results.read(target))
    assert row.startswith(f"| wan | unipc_stack | [{short} {gpu['stats']['ratio']:.3f}](ab/wan/unipc_stack__eager__tiny__h200.md)")
    assert row.endswith("| *planned* |")  # compile mode
    joint = ", ".join(sorted(f.name for f in each_sets("wan")[-1][0]))  # the catalog's joint set for Wan
    assert f"| wan | all: {joint} | *planned* | *planned* |" in lines
    assert table.coverage_table(results_dir, campaign.states(tmp_path / "none", results_dir)) == []


def test_effects_plot_of_gpu_results(unipc_result, tmp_path):
    _, path, r, _ = unipc_result
    (tmp_path / "ab" / "wan").mkdir(parents=True)
    (tmp_path / "ab" / "wan" / path.name).write_text(json.dumps(r))
    table.write(tmp_path)
    assert not (tmp_path / "effects.png").exists() and "effects.png" not in (tmp_path / "README.md").read_text()
    gpu = json.loads(json.dumps(r))
    gpu["environment"].update(device="cuda", gpu="NVIDIA H200")
    (tmp_path / "ab" / "wan" / path.name).write_text(json.dumps(gpu))
    table.write(tmp_path)
    assert drawn(tmp_path / "effects.png")
    assert "![test/control of every GPU A/B with the interval it was decided on](effects.png)" in (tmp_path / "README.md").read_text()


def test_an_ab_on_another_diffusers_runs_in_a_process_that_imports_it(tmp_path, monkeypatch, capfd):
    """`lab ab --diffusers SPEC`: both arms on a diffusers other than the installed one (here a marked copy of it),
    in a process that imports it first; the result records that version and is named for it, beside the installed
    one's. The command starts in this process (`lab.cli.main` reading `sys.argv`, as the `lab` script does), which
    has imported the installed diffusers already; the process that runs the A/B is a real one."""
    from lab import cli
    from lab.results import store
    from tests.conftest import marked_diffusers_copy

    site, version = marked_diffusers_copy(tmp_path)
    out = tmp_path / "ab"
    monkeypatch.setattr("sys.argv", ["lab", "ab", "--fix", "hook_registry_cache", "--pipeline", "flux", "--diffusers",
                                     str(site), "--blocks", "2", "--repeat", "1", "--no-profile", "--out", str(out),
                                     "--trace-dir", str(tmp_path / "traces")])
    code = cli.main()
    err = capfd.readouterr().err  # this process's and the child's (file descriptor 2, which it inherits)
    assert code == 0, err[-3000:]
    assert f"diffusers {version} (site-packages {site}): the A/B runs in a process that imports it" in err
    path = out / "flux" / f"hook_registry_cache__eager__tiny-diffusers{version}__cpu.json"
    r = store.read(path)
    assert r.on_diffusers == r.environment.diffusers == version and r.verify.identical
    assert f"· diffusers {version} ·" in path.with_suffix(".md").read_text()
    assert not list((out / "flux").glob("*__eager__tiny__cpu.*"))  # nothing in the installed diffusers' name


def test_within_compiler_rounding():
    # FLUX.1 with FasterCache under regional compile: 0.031 apart compiled, bit-identical eagerly
    assert ab.within_compiler_rounding(0.03125, 0.0, 0.0625, 0.03125, tolerance=0.0)
    assert ab.within_compiler_rounding(0.03125, 0.0, 0.0, 0.03125, tolerance=0.0)  # either arm's rounding bounds it
    assert not ab.within_compiler_rounding(0.125, 0.0, 0.0625, 0.03125, tolerance=0.0)  # more than compiling moves
    assert not ab.within_compiler_rounding(0.03125, 0.004, 0.0625, 0.0625, tolerance=0.0)  # eagerly they differ
    assert ab.within_compiler_rounding(0.03125, 0.004, 0.0625, 0.0625, tolerance=0.01)  # within the fix's own


class _CompiledArm:
    """An arm whose output depends on whether compiled code runs eagerly (`torch.compiler.set_stance`): what
    compiling rounds differently, and what the arm computes."""

    def __init__(self, name: str, eager: float, compiled: float):
        self.name, self.fixes, self.outputs = name, [], {True: eager, False: compiled}

    def verify_call(self, built, seed, count=True):
        import torch._dynamo.eval_frame as frames

        return torch.full((2, 3), self.outputs[frames._stance.stance == "force_eager"]), {}


def test_a_compiled_difference_within_the_compilers_own_rounding_counts_as_equal():
    """Compiled, a fix that moves a graph break makes other graphs, which round differently: the arms are run once
    more eagerly, and outputs equal there and apart compiled by no more than compiling moves either arm pass."""
    marks: list[str] = []
    checked = ab.verify(object(), _CompiledArm("control", 1.0, 1.0625), _CompiledArm("test", 1.0, 1.03125), seed=0,
                        compiled=True, mark=marks.append)
    assert checked["within_tolerance"] and not checked["identical"] and checked["max_abs_diff"] == 0.03125
    assert checked["compiler_rounding"] == {"eager_diff": 0.0, "control_compiled_vs_eager": 0.0625,
                                            "test_compiled_vs_eager": 0.03125, "accepted": True}
    assert marks == ["counting", "eager check"]
    # a fix that changes the computation: apart eagerly too
    changed = ab.verify(object(), _CompiledArm("control", 1.0, 1.0625), _CompiledArm("test", 1.5, 1.53125), seed=0,
                        compiled=True)
    assert not changed["within_tolerance"] and not changed["compiler_rounding"]["accepted"]
    # eager mode, or arms in worker processes (no shared build): no second look
    assert "compiler_rounding" not in ab.verify(object(), _CompiledArm("control", 1.0, 1.0),
                                                _CompiledArm("test", 1.5, 1.5), seed=0)
    assert "compiler_rounding" not in ab.verify(None, _CompiledArm("control", 1.0, 1.0625),
                                                _CompiledArm("test", 1.0, 1.03125), seed=0, compiled=True)


def test_the_page_says_when_a_compiled_difference_is_the_compilers_rounding():
    from lab.pages.report import markdown

    path = ROOT / "results/ab/flux/faster_cache_timestep_once+hook_registry_cache+no_progress_bar__compile__full-faster_cache__h100.json"
    data = json.loads(path.read_text())
    data["verify"].update(within_tolerance=True, compiler_rounding={
        "eager_diff": 0.0, "control_compiled_vs_eager": 0.0625, "test_compiled_vs_eager": 0.03125, "accepted": True})
    page = markdown(msgspec.convert(data, ABResult))
    assert "max |diff| 0.0312, beyond the tolerance 0." in page  # bold only where nothing accepted it
    assert ("run eagerly they differ by 0, and compiling moves each arm's output from its eager one by 0.0625 "
            "(control) and 0.0312 (test): the difference is the compiler's own rounding, and the arms count as "
            "equal.") in page


def test_the_offload_plot_splits_each_arms_call_by_its_steps(unipc_result, tmp_path):
    """`results/model_offload.png`: one pair of bars per GPU A/B of a model-offload fix in model CPU offload, each
    arm's call median split into its first step, its later steps and the rest; other results draw nothing."""
    from lab.pages import offload_plot

    _, path, r, _ = unipc_result
    (tmp_path / "ab" / "wan").mkdir(parents=True)
    gpu = json.loads(json.dumps(r))
    gpu["environment"].update(device="cuda", gpu="NVIDIA H100 80GB HBM3")
    (tmp_path / "ab" / "wan" / path.name).write_text(json.dumps(gpu))
    table.write(tmp_path)
    assert not (tmp_path / "model_offload.png").exists()  # a fix of the loop, no setting: not an offload A/B
    gpu.update(fixes=["model_offload_pinned"], base=["model_offload_keep_host"], settings=["model_cpu_offload"])
    gpu["step_times"] = {"control": [900.0, 50.0, 50.0, 50.0], "test": [150.0, 50.0, 50.0, 50.0]}
    gpu["stats"].update(control_median=1100.0, test_median=290.0)
    (tmp_path / "ab" / "wan" / "model_offload_pinned-over-model_offload_keep_host.json").write_text(json.dumps(gpu))
    ((result,),) = offload_plot.offload_results(tmp_path).values()
    control, test = offload_plot.bars(result)
    assert control == offload_plot.Bar("model_offload_keep_host", 900.0, 150.0, 50.0)
    assert test == offload_plot.Bar("model_offload_pinned", 150.0, 150.0, 0.0)  # medians need not add: at least 0
    table.write(tmp_path)
    assert drawn(tmp_path / "model_offload.png")
    assert "](model_offload.png)" in (tmp_path / "README.md").read_text()

"""Cross-process A/Bs: a fresh pair of worker processes per block turns a process effect into noise; one pair for
every block makes it a bias (issue: two processes are not one). Real workers on the tiny Wan, on the CPU."""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from lab.measure import ab
from lab.measure.blocks import benchmark
from lab.run.description import Run
from lab.run.runner import CompileSpec
from lab.run.worker import IsolatedArm, WorkerPairs
from tests.conftest import lab_here

RUN = Run(scenario="wan", size="tiny", device="cpu")
#: a host stall per step in the process started first of each pair: a process-level slowdown of known size
#: (4 steps x 150 ms against a tiny call of ~30 ms; at 40 ms a clean-clone CI run, its two cores shared with another
#: test's processes, saw a block's ratio of 0.57: the tiny call itself had slowed to some 200 ms)
STALL_MS = 150.0


def blocks(fresh: bool, n: int = 2, at_once: int = 1) -> tuple[list[float], WorkerPairs]:
    """Per-block ratios (test / control) of an A/A whose process started first is slow."""
    control = IsolatedArm("control", [], RUN, start=False)
    test = IsolatedArm("test", [], RUN, start=False)
    pairs = WorkerPairs(control, test, warmup_calls=0, seed=0, fresh=fresh, stall_first_ms=STALL_MS, at_once=at_once)
    config = ab.ABConfig(blocks=n, lead_in=0, repeat=1, profile=False)
    try:
        bench = benchmark(None, [control, test], config, lambda _: None, renew=pairs)
    finally:
        pairs.close()
        control.close()
        test.close()
    c, t = bench["samples"]["control"]["wall_ms"], bench["samples"]["test"]["wall_ms"]
    return [b / a for a, b in zip(c, t)], pairs


@pytest.mark.slow
def test_a_process_effect_is_a_bias_under_one_pair_and_noise_under_fresh_pairs():
    one, persistent = blocks(fresh=False)
    # one pair: the control's process started first in the one pair there is, so it is slow in every block
    assert persistent.summary()["pairs"] == 1 and persistent.summary()["processes"] == 2
    assert all(r < 0.5 for r in one), one
    # a fresh pair per block, started in alternating order: the slow process is the control's in block 1 and the
    # test's in block 2, so the effect changes sign between blocks and the ratios straddle 1. The two blocks' pairs
    # start at once (a pair started ahead that no block uses: the next test)
    fresh, pairs = blocks(fresh=True, n=2, at_once=2)
    assert pairs.summary() == {**pairs.summary(), "design": "fresh pair per block", "pairs": 2, "processes": 4,
                               "at_once": 2, "unused": 0}
    assert fresh[0] < 0.5 and fresh[1] > 2, fresh
    assert 0.5 < (fresh[0] * fresh[1]) ** 0.5 < 2
    assert not workers_alive()


class _Arm(IsolatedArm):
    """An arm whose "worker" is the process of `sleep`: what `WorkerPairs` starts ahead, adopts and closes, without
    the seconds a worker spends importing torch and diffusers and building (the test above has the real ones)."""

    def __init__(self, name: str) -> None:
        self.name, self.proc, self.log, self.ready = name, None, None, {}
        self.started, self.stalls_total, self._stalls_seen = 0, 0, 0

    def spare(self) -> "_Arm":
        return _Arm(self.name)

    def start(self, stall_ms: float = 0.0) -> None:
        import subprocess

        self.proc = subprocess.Popen(["sleep", "60"])
        self.started += 1

    def wait_ready(self) -> None:
        self.ready = {}

    def call(self, built, warmup: int, seed: int, marks: bool = True) -> None:
        assert self.proc.poll() is None  # a pair's process, running

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def test_pairs_started_ahead_that_no_block_uses_are_closed():
    """Three blocks' pairs start at once; the run decides after two, and the third pair is closed unused."""
    control, test = _Arm("control"), _Arm("test")
    pairs = WorkerPairs(control, test, warmup_calls=0, seed=0, fresh=True, at_once=3)
    started = []
    for block in (0, 1):
        pairs(block)
        started += [control.proc, test.proc]
    waiting = [arm.proc for pair in pairs._waiting.values() for arm in pair.values()]
    assert len(waiting) == 2 and all(p.poll() is None for p in waiting)
    pairs.close()
    control.close()
    test.close()
    assert pairs.summary() == {**pairs.summary(), "pairs": 2, "processes": 4, "at_once": 3, "unused": 2}
    assert all(p.poll() is not None for p in started + waiting)  # every process ended, the unused pair's too


def workers_alive() -> list[str]:
    """This process's worker children still running (Linux: read from /proc)."""
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and "lab.run.worker" in cmd:
            alive.append(proc.name)
    return alive


@pytest.mark.slow
def test_calibrate_across_processes_runs_the_positive_control_in_the_control_workers(tmp_path, monkeypatch):
    """The arms' workers are real processes; the command that pairs them runs in this one (`lab.cli.main`), from
    `tmp_path`, where its log goes."""
    from lab import cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["calibrate", "--pipeline", "wan", "--isolate", "--one-pair", "--trials", "1", "--blocks", "2",
                     "--repeat", "1", "--lead-in", "0", "--stall-ms", "5", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "wan__eager__tiny__cpu__one-pair.json").read_text())
    assert result["processes"] == "both arms in worker processes of their own, one pair per trial"
    assert result["config"]["isolated"] and result["config"]["timing"]["one_pair"]
    aa, positive = result["trials"]["aa"][0], result["trials"]["positive"][0]
    assert aa["stalls_ran"] == 0
    # the pair's warm-up call and 2 timed calls, 4 steps each, all in the control arm's worker and each stalled
    assert positive["stalls_ran"] == 3 * 4
    page = (tmp_path / "wan__eager__tiny__cpu__one-pair.md").read_text()
    assert "Processes: both arms in worker processes of their own, one pair per trial." in page


def test_one_pair_needs_processes():
    proc = lab_here("calibrate", "--pipeline", "wan", "--one-pair", "--trials", "1")
    assert proc.returncode == 2 and "`--one-pair` pairs worker processes: it needs `--isolate`." in proc.stderr


@pytest.mark.slow
def test_a_compiled_worker_arm_gives_its_output_without_the_counting_wrappers_and_its_counts_apart():
    """`lab ab --isolate --mode compile`: the verification asks each worker for a plain call's output and the test
    arm's worker for one more, counted (the counting wrappers are code the compiler traces); the outputs match and
    the fix's code is counted, as in process."""
    from lab.apply.fix import get_fix

    run = dataclasses.replace(RUN, compile=CompileSpec(mode="compile", compile_mode="default", backend="eager"))
    control = IsolatedArm("control", [], run, start=False)
    test = IsolatedArm("test", [get_fix("unipc_stack")], run, start=False)
    try:
        for arm in (control, test):  # both build side by side
            arm.start()
        for arm in (control, test):
            arm.wait_ready()
        plain, counts = test.verify_call(None, 0, count=False)
        assert counts == {} and plain.numel()
        checked = ab.verify(None, control, test, seed=0, compiled=True)
    finally:
        control.close()
        test.close()
    assert checked["identical"] and checked["exercised"]["unipc_stack"] == 7

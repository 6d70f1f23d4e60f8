"""`lab calibrate`: the A/B engine's false-positive rate (A/A) and power (a positive control of known cost), with
the decision rule exactly as `lab ab` uses it: a sequential design looks after every block, so every look counts.

- A/A: K comparisons in which both arms run the same code. The share called faster or slower estimates the
  false-positive rate; it should not exceed alpha by more than its sampling error sqrt(alpha (1 - alpha) / K).
- Positive control: K comparisons in which the control arm has an injected per-step host stall (a device sync plus
  a sleep of known cost) and the test arm does not. The share called faster estimates the power.

Each trial records how many blocks and how many seconds of blocks it took to decide.

Across processes (`lab calibrate --isolate`), each trial is a cross-process comparison as `lab ab --isolate` and
two-diffusers A/Bs run it: both arms in worker processes of their own running the same code, a fresh pair per
block (or with `one_pair`, one pair for the whole trial, the design before fresh pairs). The positive control's
stall then runs in the control arm's processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from lab.measure import ab, blocks
from lab.results.schema import AASummary, CalibrationResult, CalibrationTrial, CalibrationTrials, PositiveSummary
from lab.run.runner import timed_call
from lab.run.scenario import Built
from lab.verdicts import stats


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    trials: int = 40
    timing: ab.ABConfig = ab.ABConfig(profile=False)  # the design and block layout, as `lab ab` would use them
    stall_ms: float = 0.5  # injected per-step cost of the positive control
    isolated: bool = False  # both arms in worker processes of their own (`lab.run.worker.WorkerPairs`)
    positive: bool = True  # a positive-control trial after each A/A trial


#: one trial's arms: (control, test, renew before each block or None, stalls the control arm has run so far)
Arms = tuple[Any, Any, Any, Callable[[], int]]


@contextlib.contextmanager
def in_process(built: Built, stall_ms: float) -> Iterator[Arms]:
    """Both arms in this process, switched per call; `stall_ms` > 0: the control arm stalls (the positive control)."""
    control = ab.Arm("control", [], hook=ab.injected_stall(built.device, stall_ms) if stall_ms else None)
    yield control, ab.Arm("test", []), None, lambda: control.hook.ran if control.hook else 0


def in_processes(run: Any, config: CalibrationConfig, warmup_calls: int,
                 diffusers: Any = None) -> Callable[[float], contextlib.AbstractContextManager[Arms]]:
    """Each trial's arms in worker processes of their own, each building `run` (`lab.run.description.Run`) and both
    running `diffusers` (None: the installed one), paired over the blocks as `config.timing.one_pair` says."""
    from lab.run.worker import IsolatedArm, WorkerPairs

    @contextlib.contextmanager
    def arms(stall_ms: float) -> Iterator[Arms]:
        control = IsolatedArm("control", [], run, diffusers=diffusers, start=False)
        test = IsolatedArm("test", [], run, diffusers=diffusers, start=False)
        pairs = WorkerPairs(control, test, warmup_calls, config.timing.seed, fresh=not config.timing.one_pair,
                            stall_ms={"control": stall_ms} if stall_ms else None, at_once=config.timing.pairs_at_once)
        try:
            yield control, test, pairs, lambda: control.stalls_total
        finally:
            pairs.close()
            control.close()
            test.close()

    return arms


def _trial(built: Built | None, arms: Callable[[float], contextlib.AbstractContextManager[Arms]], stall_ms: float,
           config: CalibrationConfig, k: int, label: str, progress: Callable[[str], None]) -> CalibrationTrial | None:
    """Trial `k` of one kind, or None when Ctrl-C or a campaign's time limit cut it short (then it is left out: its
    blocks stopped for no reason of the rule's)."""
    abc = dataclasses.replace(config.timing, seed=config.timing.seed + k, profile=False)
    try:
        with arms(stall_ms) as (control, test, renew, stalls):
            before = stalls()
            bench = blocks.benchmark(built, [control, test], abc, lambda _: None, renew=renew)
            ran = stalls() - before
    except KeyboardInterrupt:
        return None
    c, t = bench["samples"]["control"]["wall_ms"], bench["samples"]["test"]["wall_ms"]
    if bench["interrupted"] or bench["stopped"] == "time limit" or not c:
        return None
    comp = stats.compare(c, t, design=abc.design(), margin=abc.margin)
    # print the interval the verdict rests on: the equivalence interval for an equivalence call
    lo, hi = comp.ci_equivalence if comp.equivalent else comp.ci
    level = comp.level_equivalence if comp.equivalent else comp.level
    progress(f"  {label} {k + 1}/{config.trials}: {comp.verdict} after {comp.n} blocks ({sum(bench['block_s']):.1f} s), "
             f"ratio {comp.ratio:.4f}, {level} CI [{lo:.4f}, {hi:.4f}]")
    return CalibrationTrial(
        trial=k, verdict=comp.verdict, direction=comp.direction, ratio=comp.ratio, ci=tuple(comp.ci),
        ci_equivalence=tuple(comp.ci_equivalence), blocks=comp.n, seconds=sum(bench["block_s"]),
        stopped=bench["stopped"], control_ms=c, test_ms=t, stalls_ran=ran,
        # what a look into a surprising trial needs: which arm went first in each block, and every timed call
        first=[order[0] for order in bench["order"]],
        calls_ms={arm: bench["samples"][arm]["raw_wall_ms"] for arm in ("control", "test")})


def _effort(trials: list[CalibrationTrial]) -> dict:
    blocks = [t.blocks for t in trials if t.blocks is not None]
    seconds = [t.seconds for t in trials if t.seconds is not None]
    return {"blocks_median": stats.median(blocks) if blocks else None, "blocks_max": max(blocks, default=None),
            "seconds_median": stats.median(seconds) if seconds else None, "seconds_max": max(seconds, default=None),
            "seconds_total": sum(seconds)}


def calibrate(built: Built | None, config: CalibrationConfig, progress: Callable[[str], None],
              arms: Callable[[float], contextlib.AbstractContextManager[Arms]] | None = None,
              steps: int | None = None, prior: CalibrationResult | None = None,
              save: Callable[[dict], None] | None = None) -> dict:
    """A/A trials, each followed by a positive-control trial. `built`: the pipeline both arms share in this
    process; or None with `arms` (`in_processes`) and the pipeline's `steps`, each arm in worker processes of its
    own. `prior`: the trials of an earlier run of the same calibration that stopped (`resume_problems` accepts it),
    gone on from. `save(outcome)` after every trial, the outcome marked interrupted until the last: a run killed
    outright keeps every trial it completed."""
    if built is not None:
        progress("warming up ...")
        for _ in range(2):
            timed_call(built, marks=False)
        arms, steps = (lambda stall_ms: in_process(built, stall_ms)), built.steps
    where = ("both arms in worker processes of their own, " + (
        "one pair per trial" if config.timing.one_pair else "a fresh pair per block" + (
            f", the pairs of {config.timing.pairs_at_once} blocks building at once" if config.timing.pairs_at_once > 1
            else ""))) if built is None else "one process"
    progress(f"{config.trials} A/A comparisons of identical arms ({where})"
             + (f", each followed by a positive control (a {config.stall_ms} ms host stall per step, removed in the "
                "test arm)" if config.positive else "") + f"; {config.timing.describe()}")
    aa: list[CalibrationTrial] = list(prior.trials.aa) if prior is not None else []
    pos: list[CalibrationTrial] = list(prior.trials.positive) if prior is not None else []
    if prior is not None:
        progress(f"going on from {len(aa)} A/A and {len(pos)} positive trial(s)")
    kinds = (("A/A", 0.0, aa), ("positive", config.stall_ms, pos))[:2 if config.positive else 1]
    interrupted = False
    deadline, took = blocks.time_limit(), []  # a campaign's time limit (`LAB_DEADLINE`), and this run's trials' seconds
    for k in range(config.trials):  # the two kinds alternate: a run cut short keeps as many of each
        for label, stall_ms, out in kinds:
            if len(out) > k:  # measured by the run this one goes on from
                continue
            if deadline is not None and took and time.time() + max(took) + blocks.DEADLINE_MARGIN_S > deadline:
                interrupted = True  # a trial cut off by the limit would be lost: stop before it, cleanly
                progress(f"  stopping before {label} trial {k + 1}: it would end past the time limit; "
                         f"keeping the {len(aa)} A/A and {len(pos)} positive trial(s) that completed (--resume goes on)")
                break
            started = time.time()
            trial = _trial(built, arms, stall_ms, config, k, label, progress)
            took.append(time.time() - started)
            if trial is None:
                interrupted = True
                progress(f"  interrupted: keeping the {len(aa)} A/A and {len(pos)} positive trial(s) that completed")
                break
            out.append(trial)
            if save is not None:
                save(summary(aa, pos, config, steps, where, interrupted=True))
        if interrupted:
            break
    return summary(aa, pos, config, steps, where, interrupted)


def merge_trials(kept: list[CalibrationTrial], other: list[CalibrationTrial]) -> tuple[list[CalibrationTrial], int]:
    """`kept` with the trials of `other` that it lacks: `other` is a run that went on from some of the same trials
    (each run resumed from one committed file, on another GPU or in another call). The trials both hold (the same
    number and timed calls, whatever run letter each file gave them) are kept once; each other trial of `other` is
    added, and one whose number `kept` already has gets the next run letter that is free for that number ("b", "c",
    ...; its seed, which sets only the arm order, repeats). Returns the merged trials and how many were added."""
    def same(a: CalibrationTrial, b: CalibrationTrial) -> bool:
        return (a.trial, a.control_ms, a.test_ms) == (b.trial, b.control_ms, b.test_ms)

    import msgspec

    merged = list(kept)
    added = 0
    for t in other:
        if any(same(t, k) for k in merged):
            continue
        taken = {k.run or "a" for k in merged if k.trial == t.trial}
        if (t.run or "a") in taken:
            t = msgspec.structs.replace(t, run=next(c for c in "bcdefghijklmnopqrstuvwxyz" if c not in taken))
        merged.append(t)
        added += 1
    return merged, added


#: what a calibration must share with the run that goes on from it (besides the trial count)
SAME = ("scenario", "size", "layers", "steps", "mode", "build")


def resume_problems(previous: CalibrationResult, current: dict) -> list[str]:
    """Why the stored calibration `previous` cannot be gone on from by a run described by `current` (its result's
    keys: the identity, `config` and `environment`); empty when it can. Trials are independent, so a run that
    stopped goes on with the next trial when everything it measured with is the same."""
    problems = [f"{key} was {getattr(previous, key)!r}, now {current.get(key)!r}" for key in SAME
                if getattr(previous, key) != current.get(key)]
    before, now = dict(previous.config), dict(current["config"])
    before.pop("trials", None), now.pop("trials", None)
    if before != now:
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        problems.append(f"its settings differ ({', '.join(changed)})")
    from lab.results import CHECKED

    problems += [f"{key} was {getattr(previous.environment, key)}, now {current['environment'].get(key)}"
                 for key in CHECKED if getattr(previous.environment, key) != current["environment"].get(key)]
    return problems


def summary(aa: list[CalibrationTrial], pos: list[CalibrationTrial], config: CalibrationConfig, steps: int,
            where: str, interrupted: bool) -> dict:
    """The rates, their intervals and the effort, from the trials: the fields of a `CalibrationResult` that the
    trials make (the command adds what it was run on)."""
    design = config.timing.design()
    alpha = design.alpha
    false_pos = sum(1 for t in aa if t.direction is not None)
    detected = sum(1 for t in pos if t.direction == "faster")
    n_aa, n_pos = len(aa), len(pos)
    sampling_error = math.sqrt(alpha * (1 - alpha) / n_aa) if n_aa else None
    fpr = false_pos / n_aa if n_aa else None
    calls = [sum(t.control_ms) / len(t.control_ms) for t in aa]
    return {
        "design": design.to_dict(), "block_layout": config.timing.describe(), "processes": where,
        "aa": AASummary(trials=n_aa, false_positives=false_pos, rate=fpr, rate_ci95=wilson(false_pos, n_aa),
                        alpha=alpha, sampling_error=sampling_error,
                        within_alpha_plus_sampling_error=bool(n_aa and fpr <= alpha + sampling_error),
                        verdicts=_count(t.verdict for t in aa), **_effort(aa)),
        "positive": PositiveSummary(trials=n_pos, detected=detected, power=detected / n_pos if n_pos else None,
                                    power_ci95=wilson(detected, n_pos), stall_ms_per_step=config.stall_ms,
                                    steps=steps, expected_effect_ms=config.stall_ms * steps,
                                    median_ratio=stats.median([t.ratio for t in pos]) if pos else None,
                                    verdicts=_count(t.verdict for t in pos), **_effort(pos)),
        "call_ms_median": stats.median(calls) if calls else None,
        "interrupted": interrupted,
        "trials": CalibrationTrials(aa=aa, positive=pos),
    }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out

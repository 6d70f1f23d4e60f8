"""An A/B's timing blocks: both arms in every block, in counterbalanced order, their calls mirrored; a sequential
design looks after every block and stops at its first decision, a time limit or a Ctrl-C (the blocks done are kept).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lab.base.errors import raise_if_interrupted
from lab.measure.config import ABConfig
from lab.measure.verify import ArmLike
from lab.run.scenario import Built
from lab.verdicts import stats

if TYPE_CHECKING:
    from lab.results.schema import ABResult


#: seconds kept before a campaign's time limit (`LAB_DEADLINE`) for a run to write its result, page and plot
DEADLINE_MARGIN_S = 30.0


def time_limit() -> float | None:
    """The time (`time.time()`) by which a campaign's time limit ends this job (`LAB_DEADLINE`, set by
    `lab campaign run --time-limit`), or None. A sequential run stops its blocks before it, as if its budget were
    spent there: a run cut off by the limit instead would be interrupted, and an interrupted `--replace` run leaves
    the result it was to replace in place."""
    value = os.environ.get("LAB_DEADLINE")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def first_arms(blocks: int, arms: int, seed: int) -> list[int]:
    """Which arm goes first in each block: counterbalanced in consecutive runs of `arms` blocks (each arm first once
    per run, in a random order), so the order is balanced after every complete run, whenever a sequential design
    stops. A plain shuffle per block can put one arm first in most blocks, and consecutive calls are not
    exchangeable: the second call of a pair can run slower whichever arm it is (FINDINGS, "order effects")."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < blocks:
        run = list(range(arms))
        rng.shuffle(run)
        out += run
    return out[:blocks]


def benchmark(built: Built | None, arms: list[ArmLike], config: ABConfig, progress: Callable[[str], None],
              prior: ABResult | None = None, renew: Callable[[int], None] | None = None, *,
              first_block_s: float | None = None, interrupted: bool = False, settle_after: int | None = None,
              bound: tuple[float, float] | None = None, bounded: bool = False) -> dict:
    """Interleaved blocks; returns raw samples and why the blocks stopped. A sequential design looks after every
    block and stops at the first decision; Ctrl-C stops after the last complete block and keeps it. With `prior`
    (an earlier run's result that `resume_problems` accepts) its blocks are this run's first blocks and the looks
    go on from the next one, as if that run had never stopped; `config.budget_s` counts this run's blocks only.
    `renew(block)` runs first in every block (a fresh pair of worker processes, `lab.run.worker.WorkerPairs`); its
    time counts in the block's. Before this run's first block, `first_block_s` (an estimate from the calls so far)
    stands for the blocks' length at a time limit. `interrupted`: the run was interrupted before its blocks (in its
    profiles); none is timed, and the prior's blocks are returned as they were. `settle_after`: the blocks after which
    the run stops whatever they say (`stopped`: "not exercised"; `run` sets it where no fix's code ran). `bound`: the
    test/control ratios the trace allows, which cut each look's equivalence interval; `bounded`: the bound alone
    decided, and no block is timed (`stopped`: "bounded")."""
    design = config.design()
    firsts = first_arms(design.max_blocks, len(arms), config.seed)
    samples: dict[str, dict[str, list]] = {a.name: {"wall_ms": [], "steps_ms": [], "raw_wall_ms": [], "raw_steps_ms": []}
                                           for a in arms}
    orders: list[list[str]] = []
    block_s: list[float] = []
    looks: list[dict] = []
    if prior is not None:
        import msgspec

        before = msgspec.to_builtins(prior.samples)
        for name, series in samples.items():
            for key, values in series.items():
                values.extend(before[name][key])
        orders += prior.order or []
        block_s += prior.block_s or []
        looks += msgspec.to_builtins(prior.looks or [])
    done, timed_before = len(orders), len(block_s)
    stopped = "blocks done"
    start = time.perf_counter()
    deadline = time_limit()
    if bounded:
        stopped = "bounded"
    try:
        for block in range(done, design.max_blocks if not (interrupted or bounded) else done):
            raise_if_interrupted()  # one whose exception a finalizer swallowed during the last block
            if settle_after is not None and len(orders) >= settle_after:
                stopped = "not exercised"
                break
            if config.budget_s is not None and block_s[timed_before:] and (
                    time.perf_counter() - start + stats.median(block_s[timed_before:]) > config.budget_s):
                stopped = "budget spent"
                break
            # the blocks' length: this run's, else the run it goes on from, else the estimate from the calls so far
            expected = (stats.median(block_s[timed_before:]) if block_s[timed_before:] else
                        stats.median(block_s) if block_s else first_block_s)
            if config.sequential and deadline is not None and expected is not None and (
                    time.time() + expected + DEADLINE_MARGIN_S > deadline):
                stopped = "time limit"  # a clean stop: the result is written in its place, and can go on
                progress(f"  stopping before block {block + 1}: the next would end past the campaign's time limit")
                break
            t0 = time.perf_counter()
            if renew is not None:
                renew(block)
            order = arms[firsts[block]:] + arms[:firsts[block]]
            gc.collect()  # outside the timed calls, which run with the collector off
            for _ in range(config.lead_in):  # the block's first call runs apart from the rest: it is not timed
                order[0].call(built, 0, config.seed, marks=False)
            block_results: dict[str, list] = {a.name: [] for a in arms}
            # Alternate the arms call by call inside the block, mirrored (C T T C C T ...): a slow spell of the
            # machine falls on both arms, and so do a linear trend and a period-2 pattern (a slower second call of
            # each pair, which a plain C T C T would charge to one arm).
            for r in range(max(1, config.repeat)):
                for arm in (order if r % 2 == 0 else order[::-1]):
                    block_results[arm.name].append(arm.call(built, config.warmup, config.seed))
            for name, calls in block_results.items():
                walls = [r.wall_ms for r in calls]
                samples[name]["raw_wall_ms"].append(walls)
                samples[name]["raw_steps_ms"].append([r.steps_ms for r in calls])
                samples[name]["wall_ms"].append(stats.median(walls))
                samples[name]["steps_ms"].append(
                    [stats.median([r.steps_ms[i] for r in calls]) for i in range(len(calls[0].steps_ms))]
                    if all(len(r.steps_ms) == len(calls[0].steps_ms) for r in calls) else calls[0].steps_ms)
            orders.append([a.name for a in order])
            block_s.append(time.perf_counter() - t0)
            if config.sequential and config.budget_s is not None and len(block_s) == timed_before + 1:
                short = stats.budget_too_short(config.budget_s, block_s[-1], design, done=done)
                if short:
                    progress(f"  warning: {short}")
            c, t = samples["control"]["wall_ms"][-1], samples["test"]["wall_ms"][-1]
            line = f"  block {block + 1}/{design.max_blocks}: control {c:.2f} ms, test {t:.2f} ms (ratio {t / c:.4f})"
            n = block + 1
            if n >= design.min_blocks and len(samples["control"]["wall_ms"]) == n:
                decision = stats.decide(stats.log_ratios(samples["control"]["wall_ms"], samples["test"]["wall_ms"]),
                                        design, config.margin, bound)
                ci = decision.ci
                line += f"; so far {decision.ratio:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]: {decision.verdict}"
                if config.sequential:
                    looks.append({"n": n, "ratio": decision.ratio, "ci": list(ci), "ci_equivalence": list(decision.ci_eq),
                                  "verdict": decision.verdict})  # the words: a look is a progress record
                    if decision.decided:
                        stopped = "decided"
                        progress(line + f" ({time.perf_counter() - start:.0f} s of blocks)")
                        break
            progress("\r" + line)  # transient on a terminal: one status line that the next block overwrites
        else:
            if not bounded:
                stopped = ("interrupted" if interrupted else "max blocks" if config.sequential else "blocks done")
    except KeyboardInterrupt:
        stopped = "interrupted"
        progress(f"  interrupted: keeping the {len(orders) - done} complete block(s) of this run")
    return {"samples": samples, "order": orders, "interrupted": stopped == "interrupted", "stopped": stopped,
            "block_s": block_s, "looks": looks, "design": design.to_dict(), "this_run_s": sum(block_s[timed_before:])}


def step_summary(samples: dict) -> dict:
    """Per-step medians over blocks for each arm, and their ratio."""
    out = {}
    for arm, s in samples.items():
        steps = [x for x in s["steps_ms"] if x]
        if steps and all(len(x) == len(steps[0]) for x in steps):
            out[arm] = [stats.median([x[i] for x in steps]) for i in range(len(steps[0]))]
    if "control" in out and "test" in out:
        out["ratio"] = [t / c if c else None for c, t in zip(out["control"], out["test"])]
    return out


@contextlib.contextmanager
def exclusive(path: str | None, progress: Callable[[str], None]) -> Iterator[None]:
    """Hold an exclusive lock on `path` (a file every cell of one host shares) for the measuring phases."""
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as handle:
        started = time.perf_counter()
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.perf_counter() - started
        if waited > 1:
            progress(f"waited {waited:.0f} s for another cell to finish measuring ({path})")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

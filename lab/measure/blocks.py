"""An A/B's timing blocks: both arms in every block, in counterbalanced order, their calls mirrored; a sequential
design looks after every block and stops at its first decision, a time limit or a Ctrl-C (the blocks done are kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lab.base.errors import raise_if_interrupted
from lab.measure.config import ABConfig
from lab.measure.verify import ArmLike
from lab.results.states import Stop
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


@dataclasses.dataclass
class Blocks:
    """The blocks of one A/B so far: each arm's samples, each block's order and seconds, the sequential looks, and
    how many of them the run it goes on from had (`done`, `timed_before`)."""

    samples: dict[str, dict[str, list]]
    orders: list[list[str]] = dataclasses.field(default_factory=list)
    block_s: list[float] = dataclasses.field(default_factory=list)
    looks: list[dict] = dataclasses.field(default_factory=list)
    done: int = 0
    timed_before: int = 0

    @classmethod
    def start(cls, arms: list[ArmLike], prior: ABResult | None) -> Blocks:
        """No block yet, or the blocks of the run this one goes on from, as if that run had never stopped."""
        out = cls({a.name: {"wall_ms": [], "steps_ms": [], "raw_wall_ms": [], "raw_steps_ms": []} for a in arms})
        if prior is not None:
            import msgspec

            before = msgspec.to_builtins(prior.samples)
            for name, series in out.samples.items():
                for key, values in series.items():
                    values.extend(before[name][key])
            out.orders += prior.order or []
            out.block_s += prior.block_s or []
            out.looks += msgspec.to_builtins(prior.looks or [])
        out.done, out.timed_before = len(out.orders), len(out.block_s)
        return out

    @property
    def mine(self) -> list[float]:
        """This run's blocks' seconds."""
        return self.block_s[self.timed_before:]

    def add(self, order: list[ArmLike], calls: dict[str, list], seconds: float) -> None:
        for name, results in calls.items():
            walls = [r.wall_ms for r in results]
            series = self.samples[name]
            series["raw_wall_ms"].append(walls)
            series["raw_steps_ms"].append([r.steps_ms for r in results])
            series["wall_ms"].append(stats.median(walls))
            series["steps_ms"].append(
                [stats.median([r.steps_ms[i] for r in results]) for i in range(len(results[0].steps_ms))]
                if all(len(r.steps_ms) == len(results[0].steps_ms) for r in results) else results[0].steps_ms)
        self.orders.append([a.name for a in order])
        self.block_s.append(seconds)


def benchmark(built: Built | None, arms: list[ArmLike], config: ABConfig, progress: Callable[[str], None],
              prior: ABResult | None = None, renew: Callable[[int], None] | None = None, *,
              first_block_s: float | None = None, interrupted: bool = False, settle_after: int | None = None,
              bound: tuple[float, float] | None = None, bounded: bool = False) -> dict:
    """Interleaved blocks; returns raw samples and why the blocks stopped (a `Stop`). A sequential design looks after
    every block and stops at the first decision; Ctrl-C stops after the last complete block and keeps it. With
    `prior` (an earlier run's result that `resume_problems` accepts) its blocks are this run's first blocks and the
    looks go on from the next one, as if that run had never stopped; `config.budget_s` counts this run's blocks only.
    `renew(block)` runs first in every block (a fresh pair of worker processes, `lab.run.worker.WorkerPairs`); its
    time counts in the block's. Before this run's first block, `first_block_s` (an estimate from the calls so far)
    stands for the blocks' length at a time limit. `interrupted`: the run was interrupted before its blocks (in its
    profiles); none is timed, and the prior's blocks are returned as they were. `settle_after`: the blocks after which
    the run stops whatever they say ("not exercised"; `run` sets it where no fix's code ran). `bound`: the
    test/control ratios the trace allows, which cut each look's equivalence interval; `bounded`: the bound alone
    decided, and no block is timed ("bounded")."""
    design = config.design()
    firsts = first_arms(design.max_blocks, len(arms), config.seed)
    blocks = Blocks.start(arms, prior)
    stopped = Stop.BOUNDED if bounded else Stop.BLOCKS_DONE
    start = time.perf_counter()
    try:
        for block in range(blocks.done, design.max_blocks if not (interrupted or bounded) else blocks.done):
            raise_if_interrupted()  # one whose exception a finalizer swallowed during the last block
            why = _before(blocks, config, settle_after, time.perf_counter() - start, first_block_s)
            if why is not None:
                stopped = why
                if why is Stop.TIME_LIMIT:
                    progress(f"  stopping before block {block + 1}: the next would end past the campaign's time limit")
                break
            t0 = time.perf_counter()
            if renew is not None:
                renew(block)
            order = arms[firsts[block]:] + arms[:firsts[block]]
            blocks.add(order, _block(built, order, config), time.perf_counter() - t0)
            if config.sequential and config.budget_s is not None and len(blocks.mine) == 1:
                short = stats.budget_too_short(config.budget_s, blocks.block_s[-1], design, done=blocks.done)
                if short:
                    progress(f"  warning: {short}")
            line, decided = _look(blocks, block + 1, design, config, bound)
            if decided:
                stopped = Stop.DECIDED
                progress(line + f" ({time.perf_counter() - start:.0f} s of blocks)")
                break
            progress("\r" + line)  # transient on a terminal: one status line that the next block overwrites
        else:
            if not bounded:
                stopped = Stop.INTERRUPTED if interrupted else Stop.MAX_BLOCKS if config.sequential else Stop.BLOCKS_DONE
    except KeyboardInterrupt:
        stopped = Stop.INTERRUPTED
        progress(f"  interrupted: keeping the {len(blocks.orders) - blocks.done} complete block(s) of this run")
    return {"samples": blocks.samples, "order": blocks.orders, "interrupted": stopped is Stop.INTERRUPTED,
            "stopped": stopped, "block_s": blocks.block_s, "looks": blocks.looks, "design": design.to_dict(),
            "this_run_s": sum(blocks.mine)}


def _before(blocks: Blocks, config: ABConfig, settle_after: int | None, spent_s: float,
            first_block_s: float | None) -> Stop | None:
    """Why no more block starts (no fix's code ran, the budget is spent, a campaign's time limit would come first),
    or None."""
    if settle_after is not None and len(blocks.orders) >= settle_after:
        return Stop.NOT_EXERCISED
    if config.budget_s is not None and blocks.mine and spent_s + stats.median(blocks.mine) > config.budget_s:
        return Stop.BUDGET
    # the blocks' length: this run's, else the run it goes on from, else the estimate from the calls so far
    expected = (stats.median(blocks.mine) if blocks.mine else stats.median(blocks.block_s) if blocks.block_s
                else first_block_s)
    deadline = time_limit()
    if config.sequential and deadline is not None and expected is not None and (
            time.time() + expected + DEADLINE_MARGIN_S > deadline):
        return Stop.TIME_LIMIT  # a clean stop: the result is written in its place, and can go on
    return None


def _block(built: Built | None, order: list[ArmLike], config: ABConfig) -> dict[str, list]:
    """One block's timed calls of each arm, the arm that goes first first."""
    gc.collect()  # outside the timed calls, which run with the collector off
    for _ in range(config.lead_in):  # the block's first call runs apart from the rest: it is not timed
        order[0].call(built, 0, config.seed, marks=False)
    calls: dict[str, list] = {a.name: [] for a in order}
    # Alternate the arms call by call inside the block, mirrored (C T T C C T ...): a slow spell of the machine falls
    # on both arms, and so do a linear trend and a period-2 pattern (a slower second call of each pair, which a
    # plain C T C T would charge to one arm).
    for r in range(max(1, config.repeat)):
        for arm in (order if r % 2 == 0 else order[::-1]):
            calls[arm.name].append(arm.call(built, config.warmup, config.seed))
    return calls


def _look(blocks: Blocks, n: int, design: stats.Design, config: ABConfig,
          bound: tuple[float, float] | None) -> tuple[str, bool]:
    """The progress line of block `n` and whether a sequential design's look at it decides (the look recorded)."""
    c, t = blocks.samples["control"]["wall_ms"][-1], blocks.samples["test"]["wall_ms"][-1]
    line = f"  block {n}/{design.max_blocks}: control {c:.2f} ms, test {t:.2f} ms (ratio {t / c:.4f})"
    if n < design.min_blocks or len(blocks.samples["control"]["wall_ms"]) != n:
        return line, False
    decision = stats.decide(stats.log_ratios(blocks.samples["control"]["wall_ms"], blocks.samples["test"]["wall_ms"]),
                            design, config.margin, bound)
    ci = decision.ci
    line += f"; so far {decision.ratio:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]: {decision.verdict}"
    if not config.sequential:
        return line, False
    blocks.looks.append({"n": n, "ratio": decision.ratio, "ci": list(ci), "ci_equivalence": list(decision.ci_eq),
                         "verdict": decision.verdict})  # the words: a look is a progress record
    return line, decision.decided


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

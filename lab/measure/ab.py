"""The A/B engine: build once, verify, take paired profiles, run interleaved blocks, compute the verdict.

Arms are switched in one process by applying and removing the fixes (exact, cheap: the rewritten functions are
compiled once and swapped). Every block runs both arms in a random order; each arm is warmed up after each switch.
Timings: host wall time of the whole call between syncs at the call boundaries, plus per-step times from CUDA
events (host timestamps on a CPU). Progress is printed between calls, never inside a timed region.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lab.apply.fix import Fix, applied
from lab.apply.patching import CallCounter
from lab.base.errors import raise_if_interrupted
from lab.measure.verify import (  # noqa: F401 (the A/B's verification, asked of it by name)
    ArmLike,
    compiler_rounding,
    line_label,
    setting_moves,
    verify,
    within_compiler_rounding,
)
from lab.results.going_on import kept_verification
from lab.results.states import RESUMABLE
from lab.run import copy_rates
from lab.run.instrument import InjectedStall, Instrumentation, injected_stall  # noqa: F401 (the arms' hooks)
from lab.run.profile import ProfileOptions, profile_call
from lab.run.runner import CompileSpec, timed_call
from lab.run.scenario import Built
from lab.run.settings import decisions
from lab.verdicts import stats
from lab.verdicts.judge import judge
from lab.verdicts.verdict import Verdict

if TYPE_CHECKING:
    from lab.results.schema import ABResult, Segment


@dataclasses.dataclass(frozen=True)
class ABConfig:
    #: a fixed design of this many blocks; None: sequential, a look after every block from `min_blocks` until the
    #: interval decides, `max_blocks` are done or `budget_s` is spent
    blocks: int | None = None
    min_blocks: int = 6
    max_blocks: int = 40
    budget_s: float | None = None  # seconds of timing blocks (building, verifying and profiling not counted)
    lead_in: int = 1  # untimed calls at the start of each block, by the arm that goes first
    warmup: int = 0  # untimed calls per arm after each switch
    repeat: int = 2  # timed calls per arm per block, mirrored (C T T C); the block's value is their median
    alpha: float = 0.05
    margin: float = 0.01  # equivalence margin (fraction)
    seed: int = 0
    profile: bool = True
    with_stack: bool = True
    # profiled calls per arm; the trace metrics are their medians: one call is not enough (on the H200 one profiled
    # call's GPU idle in the loop measured 20.8, 102.8 and 259.7 ms for the same compiled Flux control in one run)
    profile_calls: int = 3
    #: a file that every cell on this host locks while it profiles and times, so that cells running side by side
    #: (a campaign on several GPUs) never measure at the same time; None: no lock
    timing_lock: str | None = None
    #: arms in worker processes of their own: one pair for every block (uncalibrated: a process effect moves with
    #: its arm) instead of a fresh pair per block (`lab.run.worker.WorkerPairs`)
    one_pair: bool = False
    #: fresh pairs started side by side, ahead of their blocks (`WorkerPairs.at_once`)
    pairs_at_once: int = 1

    @property
    def sequential(self) -> bool:
        return self.blocks is None

    def design(self) -> stats.Design:
        if self.sequential:
            return stats.sequential_design(self.min_blocks, self.max_blocks, self.alpha)
        return stats.fixed_design(self.blocks, self.alpha)

    def describe(self) -> str:
        calls = (f"{self.lead_in} untimed lead-in call, " if self.lead_in else "") + (
            f"{self.warmup} warm-up call(s) per switch, " if self.warmup else "") + f"{self.repeat} timed call(s) per arm"
        if self.sequential:
            budget = f", or {self.budget_s:g} s of blocks" if self.budget_s else ""
            return (f"sequential: blocks until the interval decides ({self.min_blocks} to {self.max_blocks} blocks"
                    f"{budget}); per block {calls}")
        return f"{self.blocks} blocks; per block {calls}"


@dataclasses.dataclass
class Arm:
    """One side of the comparison: the fixes it applies and an optional extra instrumentation hook."""

    name: str
    fixes: list[Fix]
    hook: Callable[[Instrumentation], None] | None = None

    @contextlib.contextmanager
    def on(self, built: Built, counter: CallCounter | None = None) -> Iterator[None]:
        with applied(self.fixes, built.pipe, counter):
            yield

    # What the engine asks of an arm (`ArmLike`). `lab.run.worker.IsolatedArm` answers it from its own process.

    def call(self, built: Built, warmup: int, seed: int, marks: bool = True):
        """`warmup` untimed calls, then one timed call, with this arm's fixes on."""
        with self.on(built):
            for _ in range(warmup):
                timed_call(built, seed=seed, marks=False, extra_patch=self.hook)
            return timed_call(built, seed=seed, marks=marks, extra_patch=self.hook)

    def verify_call(self, built: Built, seed: int, count: bool = True) -> tuple[torch.Tensor, dict[str, int]]:
        """The output of one call and the calls of the fixes' own code it made, with the decisions its settings made
        from the data (`lab.run.settings.decisions`; with `count`: the counting wrappers are code the compiler traces
        too, so a compiled call's output is taken without them)."""
        counter = CallCounter() if count else None
        with self.on(built, counter):
            with decisions(built.chosen_settings if count else []) as decided:
                out = timed_call(built, seed=seed, marks=False, extra_patch=self.hook).output
        return out, {**(dict(counter.counts) if counter else {}), **decided}

    def coverage_call(self, built: Built, seed: int) -> dict[str, list[int]]:
        """The lines of the fixes' compiled files that ran in one call (compiled code run eagerly)."""
        from lab.apply.coverage import LineCoverage, eager

        with self.on(built), eager(), LineCoverage(f for fix in self.fixes for f, _ in fix.lines) as cov:
            timed_call(built, seed=seed, marks=False, extra_patch=self.hook)
        return {f: sorted(lines) for f, lines in cov.hits.items()}

    def profile(self, built: Built, trace_dir: Path, stem: str, options: ProfileOptions, seed: int) -> Path:
        with self.on(built):
            return profile_call(built, trace_dir, stem, options, seed=seed)["trace"]


#: how much longer a profiled call (with stacks) takes than a plain one, and the seconds of trace analysis per
#: profiled pair: above what the committed H200 A/Bs measured (their profile phase over their call time: 0.9x to 2.1x
#: the calls at calls of 2 to 28 s; at calls under a second the analysis of the traces is most of it)
PROFILED_CALL_FACTOR = 2.5
ANALYSIS_S_PER_PAIR = 15.0


def profile_pairs_that_fit(wanted: int, call_s: float, seconds_left: float | None, block_s: float = 0.0) -> int:
    """How many of `wanted` profiled pairs to take when `seconds_left` remain before a time limit (None: no limit)
    and a plain call takes `call_s`: as many as end before it with room for one timing block of `block_s`, at least
    one if one pair ends before it, else none. A run whose profiles alone outlast the limit never reaches a block,
    and none of it would be kept: Flux2 Klein in group offloading (an 82 s call without the fix) was cut off in its
    one profiled pair in five device calls running, and none of them left its campaign a call time to plan from."""
    wanted = max(1, wanted)
    if seconds_left is None:
        return wanted
    pair_s = 2 * PROFILED_CALL_FACTOR * call_s + ANALYSIS_S_PER_PAIR
    if pair_s <= 0:
        return wanted
    fit = int((seconds_left - DEADLINE_MARGIN_S - block_s) // pair_s)
    if fit < 1:  # one pair if it alone ends before the limit (no block after it), else none
        fit = int(seconds_left - DEADLINE_MARGIN_S >= pair_s)
    return min(wanted, fit)


def paired_profiles(built: Built | None, control: ArmLike, test: ArmLike, trace_dir: Path, stem: str, config: ABConfig,
                    calls: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """`calls` (default `config.profile_calls`) profiled calls per arm (alternating which arm goes first), each pair
    analysed as it comes. The metrics are the medians over the pairs, with each arm's range; the per-site detail
    (sync sites, CPU gaps, function totals' call counts) is the first pair's. A Ctrl-C (or a time limit) after the
    first complete pair keeps the pairs complete by then (`cut_short`: the run then times no block); before it, it
    is raised."""
    from lab.traces.analysis import compare
    from lab.traces.trace import load
    from lab.traces.work import median_summary, summary

    # shapes give the device work's FLOPs, roofline and strided inputs (`lab.traces.work`); with Python stacks on,
    # what they add to a profiled call is small beside what the stacks cost
    options = ProfileOptions(record_shapes=True, with_stack=config.with_stack)
    paths: dict[str, list[Path]] = {"control": [], "test": []}
    pairs = []
    wanted = max(1, calls if calls is not None else config.profile_calls)
    cut_short = False
    try:
        for k in range(wanted):
            raise_if_interrupted()
            done = {}
            for arm in ((control, test) if k % 2 == 0 else (test, control)):
                done[arm.name] = arm.profile(built, trace_dir, f"{stem}_{arm.name}{f'_{k + 1}' if k else ''}", options,
                                             config.seed)
            pairs.append(compare(load(done["control"]), load(done["test"]), functions=("hooks.py:_set_context",)))
            for name, path in done.items():
                paths[name].append(path)
    except KeyboardInterrupt:
        if not pairs:
            raise
        cut_short = True
        if progress is not None:
            progress(f"  interrupted: keeping the {len(pairs)} complete profiled pair(s)")
    compiled = {arm: {k: v for k, v in pairs[0][arm]["compile"].items() if k != "outside_sites"}
                for arm in ("control", "test")}
    for arm in ("control", "test"):  # guard time per call: the median over the pairs, as the other metrics
        per_call = [p[arm]["compile"]["guards"]["per_pipeline_call_us"] for p in pairs if p[arm]["compile"].get("compiled")]
        if per_call:
            compiled[arm]["guards"] = {**compiled[arm]["guards"], "per_pipeline_call_us": stats.median(per_call),
                                       "per_pipeline_call_range_us": [min(per_call), max(per_call)]}
    result = pairs[0]
    regions = {arm: result[arm]["regions"] for arm in ("control", "test")}
    for arm in ("control", "test"):  # function totals: medians over the pairs as well
        for name, fn in regions[arm]["functions"].items():
            totals = [p[arm]["regions"]["functions"].get(name, {}).get("total_us", 0.0) for p in pairs]
            regions[arm]["functions"][name] = {**fn, "total_us": stats.median(totals)}
    return {
        "calls": len(pairs),
        "calls_wanted": config.profile_calls,
        "cut_short": cut_short,
        "traces": {k: str(v[0]) for k, v in paths.items()},
        "all_traces": {k: [str(p) for p in v] for k, v in paths.items()},
        "metrics": stats.median_metrics([p["metrics"] for p in pairs]),
        "sync_sites": result["sync_sites"],
        "regions": regions,
        "cpu_gaps_us": {arm: result[arm]["cpu_gaps"].get("gaps_us") for arm in ("control", "test")},
        "host_read_sites": {arm: result[arm]["host_reads"]["scalar_read_sites"] for arm in ("control", "test")},
        "gpu_gaps": {arm: result[arm]["gpu"].get("gaps", [])[:10] for arm in ("control", "test")},
        "name_count_changes": dict(list(result["name_counts"].items())[:20] + list(result["name_counts"].items())[-20:]),
        "compile": compiled,
        "checklist": {arm: result[arm]["checklist"] for arm in ("control", "test")},
        "gap_functions": result["gap_functions"],
        "work": {arm: median_summary([summary(p[arm]["work"]) for p in pairs]) for arm in ("control", "test")},
    }


def first_arms(blocks: int, arms: int, seed: int) -> list[int]:
    """Which arm goes first in each block: counterbalanced in consecutive runs of `arms` blocks (each arm first once
    per run, in a random order), so the order is balanced after every complete run, whenever a sequential design
    stops. A plain shuffle per block can put one arm first in most blocks, and consecutive calls are not
    exchangeable: on an H200 under torch.compile the second call of a pair ran ~4% slower whichever arm it was."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < blocks:
        run = list(range(arms))
        rng.shuffle(run)
        out += run
    return out[:blocks]


def benchmark(built: Built | None, arms: list[ArmLike], config: ABConfig, progress: Callable[[str], None],
              prior: ABResult | None = None, renew: Callable[[int], None] | None = None, *,
              first_block_s: float | None = None, interrupted: bool = False, settle_after: int | None = None) -> dict:
    """Interleaved blocks; returns raw samples and why the blocks stopped. A sequential design looks after every
    block and stops at the first decision; Ctrl-C stops after the last complete block and keeps it. With `prior`
    (an earlier run's result that `resume_problems` accepts) its blocks are this run's first blocks and the looks
    go on from the next one, as if that run had never stopped; `config.budget_s` counts this run's blocks only.
    `renew(block)` runs first in every block (a fresh pair of worker processes, `lab.run.worker.WorkerPairs`); its
    time counts in the block's. Before this run's first block, `first_block_s` (an estimate from the calls so far)
    stands for the blocks' length at a time limit. `interrupted`: the run was interrupted before its blocks (in its
    profiles); none is timed, and the prior's blocks are returned as they were. `settle_after`: the blocks after which
    the run stops whatever they say (`stopped`: "not exercised"; `run` sets it where no fix's code ran)."""
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
    try:
        for block in range(done, design.max_blocks if not interrupted else done):
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
            # machine falls on both arms, and so do a linear trend and a period-2 pattern (on the H200 every second
            # call of a pair ran ~4% slower, which a plain C T C T would have charged to one arm).
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
                                        design, config.margin)
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
            stopped = ("interrupted" if interrupted else "max blocks" if config.sequential else "blocks done")
    except KeyboardInterrupt:
        stopped = "interrupted"
        progress(f"  interrupted: keeping the {len(orders) - done} complete block(s) of this run")
    return {"samples": samples, "order": orders, "interrupted": stopped == "interrupted", "stopped": stopped,
            "block_s": block_s, "looks": looks, "design": design.to_dict(), "this_run_s": sum(block_s[timed_before:])}



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
#: what a result must share with the run that continues it, besides the design and the timing settings
IDENTITY = ("scenario", "size", "layers", "steps", "mode", "fixes", "base", "control", "isolated", "patches",
            "diffusers")
TIMING = ("margin", "lead_in", "warmup", "repeat", "seed", "one_pair")


def resume_problems(previous: ABResult, current: dict, config: ABConfig) -> list[str]:
    """Why the result `previous` cannot be the first blocks of a run described by `current` (the identity keys of
    its result, and `environment`) under `config`; empty when it can. A sequential design that stopped undecided
    (budget spent, time limit, interrupted) never looked past its last block, so going on with the same design, the same
    timing settings and the same software looks exactly where it would have looked: the error rates still hold."""
    import msgspec

    from lab import results

    stopped = previous.stopped
    if not config.sequential:
        return ["this run is a fixed design (`--blocks`); only a sequential run goes on from where another stopped"]
    if (previous.design or {}).get("kind") != "sequential":
        return ["it was a fixed design, decided once at its end"]
    if stopped == "decided":
        return [f"it is decided already ({previous.verdict_text})"]
    if stopped == "max blocks":
        return [f"it ran the most blocks its design allows ({previous.design['max_blocks']}); a longer design "
                "starts afresh (`--replace --max-blocks N`)"]
    if stopped not in RESUMABLE or not (previous.timed or previous.profiles_only):
        return [f"it has no blocks or profiles to go on from ({previous.verdict_text})"]
    same_diffs = _same_diffs(previous.patches, current.get("patches"))
    problems = [f"{key} was {_shown(key, getattr(previous, key))}, now {_shown(key, current.get(key))}"
                for key in IDENTITY if getattr(previous, key) != current.get(key)
                and not (same_diffs and key in ("patches", "fixes") and _without_diffs(key, getattr(previous, key))
                         == _without_diffs(key, current.get(key)))]
    if previous.design != config.design().to_dict():
        before = previous.design
        problems.append(f"its design was {before['min_blocks']} to {before['max_blocks']} blocks at alpha "
                        f"{before['alpha']:g} (`--min-blocks`, `--max-blocks`, `--alpha` must be the same)")
    problems += [f"`--{key.replace('_', '-')}` was {getattr(previous.config, key)}, now {getattr(config, key)}"
                 for key in TIMING if getattr(previous.config, key) != getattr(config, key)]
    if "build" in current and results.build_of(previous) != current["build"]:
        problems.append(f"its pipelines were made by the {results.build_of(previous)} build, now by the "
                        f"{current['build']} build")
    env = msgspec.structs.asdict(previous.environment)
    problems += [f"{key} was {env.get(key)}, now {current['environment'].get(key)}"
                 for key in results.CHECKED if env.get(key) != current["environment"].get(key)]
    return problems


def _same_diffs(before: dict | None, now: dict | None) -> bool:
    """Whether two `--patch` changes are the same diffs: by their content (`sha256`), whatever paths named them."""
    return bool(before and now and before.get("sha256") and before.get("sha256") == now.get("sha256"))


def _without_diffs(key: str, value):
    """An identity value with what only names the diffs' paths left out: the fix a change given as diffs makes is
    named for their file names (`patch-<stem>`), and its record holds their paths."""
    if key == "fixes":
        return [f for f in value or [] if not f.startswith("patch-")]
    return {k: v for k, v in (value or {}).items() if k != "paths"}


def _shown(key: str, value) -> str:
    """An identity value in words for a reason that a run cannot go on: a change given as diffs by its files and
    content, two diffusers by their versions; anything else as it is."""
    if key == "patches" and isinstance(value, dict):
        return (f"the diff(s) {', '.join(value.get('paths') or [])} (sha256 {str(value.get('sha256'))[:12]}; "
                f"changing {', '.join(value.get('modules') or {}) or 'nothing'})")
    if key == "diffusers" and isinstance(value, dict):
        return " against ".join(f"{arm} {(v or {}).get('version')}" for arm, v in value.items())
    return "none" if value is None else repr(value)


def segments(previous: ABResult, result: ABResult) -> tuple[list[Segment], list[str]]:
    """Which run measured which blocks of `result`, which went on from `previous`: one segment per run, the
    earliest first, and a warning when the control arm's median moved between runs (another host or another state
    of the machine: the blocks still pair within themselves, but the interval widens)."""
    before = [s for s in previous.segments or [_segment(previous, previous.samples.control.wall_ms)]
              if s.blocks]  # (a run that took profiles and no block measured none of them)
    mine = result.samples.control.wall_ms[sum(s.blocks for s in before):]
    runs = before + [_segment(result, mine)]
    moved = moved_median(runs)
    return runs, [moved] if moved else []


def moved_median(runs: list[Segment]) -> str | None:
    """The warning that the control arm's median moved between `runs` (the segments of one result), naming the hosts
    where they differ; None where it held within 5 %."""
    medians = [s.control_median_ms for s in runs if s.control_median_ms]
    if not medians or max(medians) <= 1.05 * min(medians):
        return None
    # which runs were on hosts of another size (each run's CPUs, where recorded): a control call's time moves with the
    # host and with the campaigns beside it
    # and how many campaign jobs each host was measuring at once (`host_jobs`, where recorded; a run before the lab
    # recorded it says so, rather than read as one alone: Qwen-Image's compiled group-offload set had three runs
    # beside three other campaigns before, and two after)
    hosts = [(s.control_median_ms, s.cpus, s.host_jobs) for s in runs if s.control_median_ms and s.cpus]
    recorded = any(j for _, _, j in hosts)
    named = [f"{c} CPUs" + (f" running {j} jobs at once" if j else "") + f" ({m:,.1f} ms"
             + ("; jobs at once not recorded" if recorded and not j else "") + ")" for m, c, j in hosts]
    where = f"; on hosts of {', '.join(named)}" if len({(c, j) for _, c, j in hosts}) > 1 else ""
    return (f"the control arm's median moved between the runs that measured these blocks "
            f"({', '.join(f'{m:,.1f}' for m in medians)} ms{where}): the blocks still compare the arms within "
            "themselves, but the interval is wider than one steady run's")


def _segment(run: ABResult, control_ms: list[float]) -> Segment:
    from lab.results.schema import Segment

    return Segment(created=run.created, command=run.command, blocks=len(control_ms), stopped=run.stopped,
                   driver=run.environment.driver, lab_commit=run.environment.lab_commit,
                   control_median_ms=stats.median(control_ms) if control_ms else None, cpus=run.environment.cpus,
                   host_jobs=run.environment.host_jobs)


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


def run(built: Built | None, spec: CompileSpec, control: ArmLike, test: ArmLike, config: ABConfig, trace_dir: Path,
        stem: str, progress: Callable[[str], None], compile_log: Any = None, *, tolerance: float | None = None,
        time_differing: bool = False, prior: ABResult | None = None) -> dict[str, Any]:
    """The whole A/B: warm-up, verify, paired profiles, interleaved benchmark, statistics.

    `built` is the pipeline both in-process arms share, or None when each arm is a worker process of its own.
    `result["phase_s"]` keeps how long each phase took (campaigns estimate from it). With `compile_log` (a
    `lab.traces.compile_log.StructuredLog` that is open), `result["compilation"]` says what each arm's first calls
    compiled and whether anything compiled again later. Outputs that differ beyond `tolerance` (default: the
    fixes' own) stop the run, unless `time_differing` (two diffusers releases): then they are a warning. With
    `prior` (a result that `resume_problems` accepts) the blocks go on from that result's (`benchmark`), and its
    paired profiles stand for this run's (none are taken again).
    """
    arms = [control, test]
    phase_s: dict[str, float] = {}
    started = time.perf_counter()
    progress(f"warming up both arms ({spec.describe()}) ...")
    warmup_calls = max(1, config.warmup) + (1 if spec.mode == "compile" else 0) - 1
    for arm in arms:
        if compile_log is not None:
            compile_log.mark(arm.name)
        arm.call(built, warmup_calls, config.seed, marks=False)
    phase_s["warmup"] = time.perf_counter() - started
    on_purpose = [f for f in test.fixes if getattr(f, "changes_outputs", "")]  # a cache's decisions, say
    kept = kept_verification(prior)
    if kept is not None:
        import msgspec

        progress("verification: kept from the run this one goes on from (compiled, its warm-up alone brought both "
                 "arms to what the blocks time)")
        checked = {**msgspec.to_builtins(kept), "kept_from": kept.kept_from or prior.created}
        call_s = prior.phase_s["call"]
    else:
        if compile_log is not None:
            compile_log.mark("verify")
        progress("verifying outputs and that the fixed code runs ...")
        started = time.perf_counter()
        # (compiled, the setting's hooks made again would compile again)
        checked = verify(built, control, test, config.seed, tolerance, compiled=spec.mode == "compile",
                         mark=compile_log.mark if compile_log is not None else None,
                         against_setting=bool(on_purpose) and spec.mode == "eager", reference=not on_purpose)
        phase_s["verify"] = checked["seconds"] = time.perf_counter() - started
        # one call of each arm (and a coverage call for a change given as a diff): what a plain call takes, for the
        # plans that a time limit needs before anything is timed
        call_s = phase_s["verify"] / (2 + any(f.lines for f in test.fixes) + (spec.mode == "compile"))
    if compile_log is not None:
        compile_log.mark("steady")
    phase_s["call"] = call_s  # kept: a campaign plans the next run from it where this one times no block
    block_guess_s = (config.lead_in + 2 * max(1, config.repeat) * (1 + config.warmup)) * call_s
    result: dict[str, Any] = {"verify": checked, "phase_s": phase_s}
    not_run = [name for name, n in checked["exercised"].items() if n == 0]
    # no fix's code ran: the verdict is "not exercised" whatever the blocks say (`judge`), so one block (which the
    # verdict needs) and no profiles, where a sequential design would time to its most blocks a difference that no
    # fix made (Qwen-Image's `qwen_modulate_index`, 40 blocks at a time)
    unrun = bool(test.fixes) and len(not_run) == len(test.fixes)
    if unrun:
        progress(f"the code of {', '.join(not_run)} never ran: one block, then it settles as not exercised")
    differ = []
    if not checked["within_tolerance"] and on_purpose:
        own = checked.get("setting_moves")
        differ = [f"the outputs differ by up to {checked['max_abs_diff']:.3g}, as `{f.name}` means them to: "
                  f"{f.changes_outputs}" + (f"; the setting itself moves them by up to {own:.3g} (a call without it)"
                                           if own is not None else "") for f in on_purpose]
    elif not checked["within_tolerance"] and time_differing:
        differ = [f"the outputs differ by up to {checked['max_abs_diff']:.3g} (tolerance {checked['tolerance']:g}): "
                  "the two arms compute something different, so a difference in time may come from that"]
    elif not checked["within_tolerance"]:
        result["verdict"] = Verdict.OUTPUTS_DIFFER
        against = checked.get("numerics") or {}
        result["summary"] = (f"outputs differ by up to {checked['max_abs_diff']} (tolerance {checked.get('tolerance')})"
                             + (f"; against a {against['reference']} reference, {against['reason']}"
                                if against.get("reason") else "")
                             + "; the fix changes results, so it was not timed")
        if compile_log is not None:  # what each arm compiled: a recompile in one arm can change compiled numerics
            result["compilation"] = compilation(compile_log, None)
        return result
    with exclusive(config.timing_lock, progress):
        if config.profile and prior is not None and prior.profile is not None:
            # the same code, settings and software were profiled by the run this one goes on from (`cell.continued`
            # keeps its profiles): profiling again would only cost time, minutes at a slow call
            progress("paired profiles: kept from the run this one goes on from")
        elif config.profile and not unrun:
            deadline = time_limit()
            left = deadline - time.time() if deadline is not None else None
            calls = profile_pairs_that_fit(config.profile_calls, call_s, left, block_guess_s)
            if calls:
                progress(f"paired profiles ({calls} profiled call(s) per arm"
                         + (f", of {config.profile_calls}: a call takes {call_s:,.1f} s and the time limit is "
                            f"{left:,.0f} s away" if calls < config.profile_calls else "") + ") ...")
                started = time.perf_counter()
                result["profile"] = paired_profiles(built, control, test, trace_dir, stem, config, calls, progress)
                phase_s["profile"] = time.perf_counter() - started
                # kept with the profiles, which a run that goes on from this one keeps while its `phase_s` are its
                # own: the campaign plans a profiled pair from it (without, at a guessed 3x a plain call, Flux2
                # Klein's group-offload cells were planned at 274 s a pair against the 104 s they took)
                result["profile"]["seconds"] = phase_s["profile"]
            else:
                progress(f"paired profiles: none, a call takes {call_s:,.1f} s and one profiled pair would end past "
                         f"the time limit, {left:,.0f} s away (this run keeps its call time for the next one's plan)")
        cut_short = bool((result.get("profile") or {}).get("cut_short"))
        pairs = None
        if built is None and not cut_short:  # each arm in a worker process of its own
            from lab.run.worker import WorkerPairs

            pairs = WorkerPairs(control, test, warmup_calls, config.seed, fresh=not config.one_pair,
                                at_once=config.pairs_at_once)
            progress("  " + ("one worker pair for every block (uncalibrated: a process effect would move with its arm)"
                             if config.one_pair else "a fresh pair of worker processes for every block, started "
                             "in alternating order" + (f", {config.pairs_at_once} pairs building at once"
                                                       if config.pairs_at_once > 1 else "")))
        progress("no timing blocks: interrupted in the profiles" if cut_short else f"benchmark: {config.describe()}")
        try:
            # (a fresh worker pair per block is built inside the block: no estimate from the calls so far)
            bench = benchmark(built, arms, config, progress, prior, renew=pairs,
                              first_block_s=block_guess_s if built is not None else None, interrupted=cut_short,
                              settle_after=1 if unrun else None)
        finally:
            if pairs is not None:
                pairs.close()
    phase_s["blocks"] = bench.pop("this_run_s")
    result.update(bench)
    if pairs is not None:
        result["workers"] = pairs.summary()
    result["step_times"] = step_summary(bench["samples"])
    result.update(judge(bench["samples"], bench["order"], design=config.design(), margin=config.margin,
                        not_run=not_run, fixes=[f.name for f in test.fixes], stopped=bench["stopped"],
                        block_s=bench["block_s"]))
    result["warnings"] = differ + result["warnings"]
    if compile_log is not None:
        result["compilation"] = compilation(compile_log, result.get("profile"))
        result["warnings"] += [n for n in result["compilation"]["notes"] if not n.startswith("finding:")]
    return result


def compilation(compile_log: Any, profile: dict | None) -> dict[str, Any]:
    """Each arm's compilations from the compiler's log, what they say about the fix, and the guard cost per call
    that the paired profiles measured."""
    from lab.traces.compile_log import compare_arms

    phases = compile_log.by_phase()
    control, test, steady = phases.get("control"), phases.get("test"), phases.get("steady")
    # what the verification compiled (the counting call's wrappers, and any shape the warm-up did not meet): whether
    # a run going on from a result's blocks could do without it rests on this
    verify = phases.get("verify")
    notes = compare_arms(control, test, steady)
    guards = (profile or {}).get("compile") or {}
    c, t = (guards.get(a, {}).get("guards", {}).get("per_pipeline_call_us") for a in ("control", "test"))
    if c is not None and t is not None and t - c > max(100.0, 0.1 * c):
        notes.append(f"the test arm's guard evaluation costs {t - c:,.0f} µs more per call than the control's "
                     f"({c:,.0f} -> {t:,.0f} µs in the profiled calls)")
    return {"log": str(compile_log.directory), "control": control, "test": test, "verify": verify, "steady": steady,
            "notes": notes}


def record(*, name: str, command: str, scenario: Any, info: dict, spec: CompileSpec, config: ABConfig,
           fixes: list[str], control: str, notes: list[str], isolated: bool, outcome: dict,
           **extra: Any) -> ABResult:
    """The result of one A/B: what ran, where, how it was timed, and `outcome` (what `run` returned); `extra`: more
    fields of the result (`diffusers`, `patches`)."""
    import msgspec

    from lab import results
    from lab.results.schema import ABResult

    data = {
        "name": name, "created": results.now(), "command": command,
        "scenario": scenario.name, "pipeline": scenario.pipeline_cls, "size": info["size"], "layers": info["layers"],
        "steps": info["steps"], "mode": spec.describe(), "compile": dataclasses.asdict(spec), "isolated": isolated,
        "fixes": fixes, "control": control, "notes": notes,
        "config": dataclasses.asdict(config), "environment": results.environment(info["device"], copy_rates.rates(info["device"])),
        "build": info.get("build"), "build_s": info.get("build_s"), "settings": info.get("settings") or [],
        "decoded": bool(info.get("decoded")), **outcome, **extra,
    }
    return msgspec.convert(data, ABResult)

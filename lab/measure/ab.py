"""The A/B engine: build once, verify (`verify`), take paired profiles (`profiles`), read the trace's bound
(`bounds`), run interleaved blocks (`blocks`), compute the verdict (`lab.verdicts.judge`).

Arms are switched in one process by applying and removing the fixes (exact, cheap: the rewritten functions are
compiled once and swapped). Every block runs both arms in a random order; each arm is warmed up after each switch.
Timings: host wall time of the whole call between syncs at the call boundaries, plus per-step times from CUDA
events (host timestamps on a CPU). Progress is printed between calls, never inside a timed region.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lab.apply.fix import Fix, applied
from lab.apply.patching import CallCounter
from lab.measure.blocks import benchmark, exclusive, step_summary, time_limit
from lab.measure.bounds import compute_without_offloading, offload_limits, read_bound
from lab.measure.config import ABConfig
from lab.measure.profiles import paired_profiles, profile_pairs_that_fit
from lab.measure.verify import (  # noqa: F401 (the A/B's verification, asked of it by name)
    ArmLike,
    compiler_rounding,
    line_label,
    setting_moves,
    verify,
    within_compiler_rounding,
)
from lab.results.going_on import kept_verification
from lab.run import copy_rates
from lab.run.instrument import InjectedStall, Instrumentation, injected_stall  # noqa: F401 (the arms' hooks)
from lab.run.profile import ProfileOptions, profile_call
from lab.run.description import Run
from lab.run.runner import CompileSpec, timed_call
from lab.run.scenario import Built
from lab.run.settings import decisions
from lab.verdicts.bound import TraceBound
from lab.verdicts.judge import judge
from lab.verdicts.verdict import Verdict

if TYPE_CHECKING:
    from lab.results.schema import ABResult


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


@dataclasses.dataclass
class Phases:
    """What every phase of one A/B works on: the build (None: each arm in a worker process of its own), the arms,
    the design, the compiler's log, the result it goes on from, and each phase's seconds (`phase_s`)."""

    built: Built | None
    spec: CompileSpec
    control: ArmLike
    test: ArmLike
    config: ABConfig
    progress: Callable[[str], None]
    compile_log: Any = None
    prior: ABResult | None = None
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def arms(self) -> list[ArmLike]:
        return [self.control, self.test]

    @property
    def warmup_calls(self) -> int:
        return max(1, self.config.warmup) + (1 if self.spec.mode == "compile" else 0) - 1

    def mark(self, phase: str) -> None:
        if self.compile_log is not None:
            self.compile_log.mark(phase)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phase_s[phase] = time.perf_counter() - started


def run(built: Built | None, spec: CompileSpec, control: ArmLike, test: ArmLike, config: ABConfig, trace_dir: Path,
        stem: str, progress: Callable[[str], None], compile_log: Any = None, *, tolerance: float | None = None,
        time_differing: bool = False, prior: ABResult | None = None) -> dict[str, Any]:
    """The whole A/B: warm-up, verify, paired profiles, the trace's bound, interleaved blocks, the verdict, and in
    an offloading setting the offload limit.

    `built` is the pipeline both in-process arms share, or None when each arm is a worker process of its own.
    `result["phase_s"]` keeps how long each phase took (campaigns estimate from it). With `compile_log` (a
    `lab.traces.compile_log.StructuredLog` that is open), `result["compilation"]` says what each arm's first calls
    compiled and whether anything compiled again later. Outputs that differ beyond `tolerance` (default: the
    fixes' own) stop the run, unless `time_differing` (two diffusers releases): then they are a warning. With
    `prior` (a result that `resume_problems` accepts) the blocks go on from that result's (`benchmark`), and its
    paired profiles and bound stand for this run's (none are taken again).
    """
    p = Phases(built, spec, control, test, config, progress, compile_log, prior)
    with p.timed("warmup"):
        progress(f"warming up both arms ({spec.describe()}) ...")
        for arm in p.arms:
            p.mark(arm.name)
            arm.call(built, p.warmup_calls, config.seed, marks=False)
    checked, call_s = _verification(p, tolerance)
    result: dict[str, Any] = {"verify": checked, "phase_s": p.phase_s}
    not_run = [name for name, n in checked["exercised"].items() if n == 0]
    # no fix's code ran: the verdict is "not exercised" whatever the blocks say (`judge`), so one block (which the
    # verdict needs) and no profiles, where a sequential design would time to its most blocks a difference no fix made
    unrun = bool(test.fixes) and len(not_run) == len(test.fixes)
    if unrun:
        progress(f"the code of {', '.join(not_run)} never ran: one block, then it settles as not exercised")
    differ, refused = _differences(checked, test, time_differing)
    if refused is not None:
        result.update(verdict=Verdict.OUTPUTS_DIFFER, summary=refused)
        if compile_log is not None:  # what each arm compiled: a recompile in one arm can change compiled numerics
            result["compilation"] = compilation(compile_log, None)
        return result
    with exclusive(config.timing_lock, progress):
        profile = None if unrun else _profiles(p, trace_dir, stem, call_s)
        if profile is not None:
            result["profile"] = profile
        bench, bound, workers = _timing(p, result.get("profile"), unrun, call_s)
    p.phase_s["blocks"] = bench.pop("this_run_s")
    result.update(bench)
    if bound is not None:
        result["bound"] = bound
    if workers is not None:
        result["workers"] = workers
    result["step_times"] = step_summary(bench["samples"])
    result.update(judge(bench["samples"], bench["order"], design=config.design(), margin=config.margin,
                        not_run=not_run, fixes=[f.name for f in test.fixes], stopped=bench["stopped"],
                        block_s=bench["block_s"], bound=TraceBound.from_dict(bound) if bound else None))
    result["warnings"] = differ + result["warnings"]
    if not unrun and not result.get("interrupted") and result.get("stopped") != "time limit":
        with p.timed("offload"):
            limits = offload_limits(result, compute_without_offloading(built, control, config, progress),
                                    copy_rates.rates(built.device) if built is not None else None)
        if limits is not None:
            result["offload"] = limits
        else:
            del p.phase_s["offload"]
    if compile_log is not None:
        result["compilation"] = compilation(compile_log, result.get("profile"))
        result["warnings"] += [n for n in result["compilation"]["notes"] if not n.startswith("finding:")]
    return result


def _verification(p: Phases, tolerance: float | None) -> tuple[dict, float]:
    """The verification (`verify`), or the one kept from the run this one goes on from; and what a plain call takes,
    for the plans that a time limit needs before anything is timed."""
    on_purpose = [f for f in p.test.fixes if getattr(f, "changes_outputs", "")]  # a cache's decisions, say
    kept = kept_verification(p.prior)
    if kept is not None:
        import msgspec

        p.progress("verification: kept from the run this one goes on from (compiled, its warm-up alone brought both "
                   "arms to what the blocks time)")
        checked, call_s = {**msgspec.to_builtins(kept), "kept_from": kept.kept_from or p.prior.created}, p.prior.phase_s["call"]
    else:
        p.mark("verify")
        p.progress("verifying outputs and that the fixed code runs ...")
        with p.timed("verify"):
            # (compiled, the setting's hooks made again would compile again)
            checked = verify(p.built, p.control, p.test, p.config.seed, tolerance, compiled=p.spec.mode == "compile",
                             mark=p.mark, against_setting=bool(on_purpose) and p.spec.mode == "eager",
                             reference=not on_purpose)
        checked["seconds"] = p.phase_s["verify"]
        # one call of each arm (and a coverage call for a change given as a diff, and the compiled arm's own)
        call_s = p.phase_s["verify"] / (2 + any(f.lines for f in p.test.fixes) + (p.spec.mode == "compile"))
    p.mark("steady")
    p.phase_s["call"] = call_s  # kept: a campaign plans the next run from it where this one times no block
    return checked, call_s


def _differences(checked: dict, test: ArmLike, time_differing: bool) -> tuple[list[str], str | None]:
    """What outputs beyond the tolerance mean: warnings where a fix changes them on purpose or two releases are
    compared (timed anyway), else the summary of a run that stops untimed (None where the outputs agree)."""
    if checked["within_tolerance"]:
        return [], None
    on_purpose = [f for f in test.fixes if getattr(f, "changes_outputs", "")]
    if on_purpose:
        own = checked.get("setting_moves")
        return [f"the outputs differ by up to {checked['max_abs_diff']:.3g}, as `{f.name}` means them to: "
                f"{f.changes_outputs}" + (f"; the setting itself moves them by up to {own:.3g} (a call without it)"
                                         if own is not None else "") for f in on_purpose], None
    if time_differing:
        return [f"the outputs differ by up to {checked['max_abs_diff']:.3g} (tolerance {checked['tolerance']:g}): "
                "the two arms compute something different, so a difference in time may come from that"], None
    against = checked.get("numerics") or {}
    return [], (f"outputs differ by up to {checked['max_abs_diff']} (tolerance {checked.get('tolerance')})"
                + (f"; against a {against['reference']} reference, {against['reason']}" if against.get("reason") else "")
                + "; the fix changes results, so it was not timed")


def _block_guess_s(config: ABConfig, call_s: float) -> float:
    return (config.lead_in + 2 * max(1, config.repeat) * (1 + config.warmup)) * call_s


def _profiles(p: Phases, trace_dir: Path, stem: str, call_s: float) -> dict | None:
    """The paired profiles, as many as fit before a campaign's time limit; None where none are taken (kept from the
    run this one goes on from, not asked for, or none fits)."""
    config = p.config
    if not config.profile:
        return None
    if p.prior is not None and p.prior.profile is not None:
        # the same code, settings and software were profiled by the run this one goes on from (`cell.continued`
        # keeps its profiles): profiling again would only cost time, minutes at a slow call
        p.progress("paired profiles: kept from the run this one goes on from")
        return None
    deadline = time_limit()
    left = deadline - time.time() if deadline is not None else None
    calls = profile_pairs_that_fit(config.profile_calls, call_s, left, _block_guess_s(config, call_s))
    if not calls:
        p.progress(f"paired profiles: none, a call takes {call_s:,.1f} s and one profiled pair would end past the "
                   f"time limit, {left:,.0f} s away (this run keeps its call time for the next one's plan)")
        return None
    p.progress(f"paired profiles ({calls} profiled call(s) per arm"
               + (f", of {config.profile_calls}: a call takes {call_s:,.1f} s and the time limit is {left:,.0f} s "
                  "away" if calls < config.profile_calls else "") + ") ...")
    with p.timed("profile"):
        profile = paired_profiles(p.built, p.control, p.test, trace_dir, stem, config, calls, p.progress)
    # kept with the profiles, which a run that goes on from this one keeps while its `phase_s` are its own: the
    # campaign plans a profiled pair from it rather than from a guessed multiple of a plain call
    profile["seconds"] = p.phase_s["profile"]
    return profile


def _timing(p: Phases, profile: dict | None, unrun: bool, call_s: float) -> tuple[dict, dict | None, dict | None]:
    """The trace's bound and the blocks (none where the bound decides or the profiles were interrupted): the
    blocks' record, the bound's, and how worker processes were paired over the blocks."""
    config, progress = p.config, p.progress
    cut_short = bool((profile or {}).get("cut_short"))
    found = None
    if not cut_short and not unrun:
        with p.timed("bound"):
            found = read_bound(p.built, p.control, p.test, config, profile, p.prior, progress)
        if found is None:
            del p.phase_s["bound"]
    bound = TraceBound.from_dict(found) if found else None
    usable = bound is not None and not bound.reason
    bounded = usable and bound.decided and config.bound == "decide"
    pairs = None
    if p.built is None and not cut_short and not bounded:  # each arm in a worker process of its own
        from lab.run.worker import WorkerPairs

        pairs = WorkerPairs(p.control, p.test, p.warmup_calls, config.seed, fresh=not config.one_pair,
                            at_once=config.pairs_at_once)
        progress("  " + ("one worker pair for every block (uncalibrated: a process effect would move with its arm)"
                         if config.one_pair else "a fresh pair of worker processes for every block, started in "
                         "alternating order" + (f", {config.pairs_at_once} pairs building at once"
                                                if config.pairs_at_once > 1 else "")))
    progress("no timing blocks: interrupted in the profiles" if cut_short else
             "no timing blocks: the trace's bound decides" if bounded else f"benchmark: {config.describe()}")
    try:
        # (a fresh worker pair per block is built inside the block: no estimate from the calls so far)
        bench = benchmark(p.built, p.arms, config, progress, p.prior, renew=pairs,
                          first_block_s=_block_guess_s(config, call_s) if p.built is not None else None,
                          interrupted=cut_short, settle_after=1 if unrun else None,
                          bound=(bound.lo, bound.hi) if usable else None, bounded=bounded)
    finally:
        if pairs is not None:
            pairs.close()
    return bench, found, pairs.summary() if pairs is not None else None


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


def record(*, name: str, command: str, scenario: Any, run: Run, config: ABConfig, arms: tuple[ArmLike, ArmLike],
           control: str, notes: list[str], isolated: bool, outcome: dict, built: Built | None = None,
           build_s: float | None = None, fixes: list[str] | None = None, **extra: Any) -> ABResult:
    """The result of one A/B: what ran (`run`, its build's header; `arms`, the fixes each arm ran, recorded so that
    a page never works it out from the catalog of the day), where, how it was timed, and `outcome` (what `run`
    returned); `fixes`: the fixes the result is named for (default: the test arm's); `extra`: more fields of the
    result (`diffusers`, `patches`, `base`). Where the pipeline was built in this process, `built` says what the
    build resolved (the steps a checkpoint's call takes)."""
    import msgspec

    from lab import results
    from lab.results.schema import ABResult

    header = run.header()
    if built is not None:
        header.update(size=built.size, layers=built.layers, steps=built.steps, build=built.build,
                      settings=built.settings, decoded=built.decodes)
    ran = {arm.name: [f.name for f in arm.fixes] for arm in arms}
    data = {
        "name": name, "created": results.now(), "command": command, "scenario": scenario.name,
        "pipeline": scenario.pipeline_cls, **header, "isolated": isolated,
        "fixes": fixes if fixes is not None else ran["test"], "arms": ran, "control": control, "notes": notes,
        "config": dataclasses.asdict(config), "environment": results.environment(run.device, copy_rates.rates(run.device)),
        "build_s": build_s, **outcome, **extra,
    }
    return msgspec.convert(data, ABResult)

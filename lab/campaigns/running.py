"""A campaign's run (`lab campaign run`, and what `lab campaign plan` shares with it): which cells a run measures
(`pick`), in which order its jobs start and with which command lines (`prepare`), what a dry run would start
(`dry_run`), and the run itself, within a time limit, each job's end said and written to the campaign's run log
(`execute`). What reaches the terminal goes through `say`, the caller's."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from lab.base.errors import UsageError
from lab.base.naming import fix_tag
from lab.base.units import duration
from lab.campaigns import cluster, measured, status, windows
from lab.campaigns.cells import Campaign, Cell, Job, jobs as jobs_of
from lab.campaigns.estimates import Estimate, estimate
from lab.results.states import OWED, REMEASURED, State

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Picking:
    """Which cells a run measures, as `lab campaign run`'s options say."""

    again: bool = False  # afresh, even those with a result (`--replace`); needs `only`
    only: tuple[str, ...] = ()  # the cells whose label or job contains one of these, in their order
    skip: tuple[str, ...] = ()  # then without those whose label or job contains one of these
    redo_undecided: bool = False  # the undecided cells too, not those at their design's most
    within_design: bool = False  # without the cells past their design's most blocks


@dataclasses.dataclass
class Run:
    """One campaign run: its jobs in the order they start, each job's command line and log, and its estimate."""

    plan: Campaign
    results: Path
    where: cluster.Where
    jobs: list[Job]
    estimates: dict[str, Estimate]
    planned: list[tuple[str, list[str], str]]  # (job id, argv, log) in the order they start
    limit: float | None = None  # seconds, a time limit on this host


def to_run(states: list[status.Status], redo_undecided: bool, within_design: bool) -> list[status.Status]:
    """The cells `run` measures with those flags (before `--only` and `--skip`), `plan`'s too: those owed a result,
    and with `redo_undecided` the undecided ones not at their design's most; with `within_design`, not those past
    it."""
    return [s for s in states if (s.state in OWED or (redo_undecided and s.state == State.UNDECIDED
                                                       and not s.at_limit))
            and not (within_design and s.past_design)]


def going_on(wanted: list[status.Status]) -> set[Cell]:
    """The cells of `wanted` that go on from what they have (`lab ab --resume`): the undecided ones, and an A/B with
    profiles and no block yet."""
    return {s.cell for s in wanted if s.state == State.UNDECIDED or s.going_on}


def estimates_of(jobs: list[Job], results: Path, redo: set[Cell], device: str | None) -> dict[str, Estimate]:
    """Each job's estimate from what `results` holds, going on from its blocks where one of its cells is in `redo`,
    as a run on `device` (a GPU tag; None: any) plans it."""
    return {job.id: estimate(job, measured.read(job, results, device), resume=bool(redo & set(job.cells)),
                             device=device) for job in jobs}


def pick(plan: Campaign, states: list[status.Status], picking: Picking, say: Say) -> list[status.Status]:
    """The cells a run measures (`Picking`), in the order they are to run; a text of `only` that picks no cell is said
    (a job id gone stale), and one error where none of them picks any."""
    if picking.again and not picking.only:
        raise UsageError("`--again` measures afresh cells that have a result: pick them with `--only TEXT` "
                         f"(`lab campaign plan {plan.path}` lists their labels and jobs).")
    wanted = list(states) if picking.again else to_run(states, picking.redo_undecided, within_design=False)
    # a cell's label, or the job `lab campaign plan` lists it in (`ab-flux-eager-full-lora-3sets-g1`), or the job it
    # runs in here: with `--redo-undecided` an undecided cell joins the owed ones of its build, and their job's id
    # (which counts its cells) is not the one `plan` listed
    job_of: dict[Cell, set[str]] = {}
    for cells in ([s.cell for s in states if s.state in OWED], [s.cell for s in wanted]):
        for job in jobs_of(cells):
            for c in job.cells:
                job_of.setdefault(c, set()).add(job.id)

    def picked(text: str, pool: list) -> list:
        return [s for s in pool if text in s.cell.label or any(text in id_ for id_ in job_of.get(s.cell, ()))]

    if picking.only:
        # in the order of the texts, so that the cells that matter most run first when time is short
        wanted = list({s.cell: s for text in picking.only for s in picked(text, wanted)}.values())
        if not wanted and not [s for text in picking.only for s in picked(text, states)]:
            raise UsageError(f"`--only {' / '.join(picking.only)}` matches none of the {len(states)} cells of "
                             f"{plan.path} (`lab campaign plan {plan.path}` lists their labels and jobs).")
        for text in picking.only:  # one text of several that picks nothing: most often a job id gone stale
            if not picked(text, states):
                say(f"Warning: `--only {text}` matches no cell of {plan.path}: a job's id counts the cells it has "
                    "left, so an id from an earlier plan goes stale as cells are measured; a cell's label text does "
                    f"not (`lab campaign plan {plan.path}` lists both).")
    if picking.skip:
        left_out = {s.cell for text in picking.skip for s in picked(text, wanted)}
        wanted = [s for s in wanted if s.cell not in left_out]
    return wanted


def prepare(plan: Campaign, states: list[status.Status], results: Path, picking: Picking, where: cluster.Where,
            limit: float | None, here: str | None, exclusive_timing: bool, say: Say) -> Run | None:
    """The run that `picking` asks for on `where` (the jobs' GPU `here`, where they run on this host: an undecided
    A/B goes on only from blocks measured on it), or None where it has nothing to run (said)."""
    wanted = pick(plan, states, picking, say)
    if picking.within_design and (past := [s for s in wanted if s.past_design]):
        wanted = [s for s in wanted if s not in past]
        say(f"--within-design: leaving out {len(past)} cell(s) likely past their design's most blocks "
            f"(`lab campaign plan {plan.path}` says why beside each)")
        if not wanted:
            say(f"{plan.path}: every cell left to run is past its design's most; nothing to run (without "
                "`--within-design` they run).")
            return None
    redo = set() if picking.again else going_on(wanted)
    jobs = jobs_of([s.cell for s in wanted])
    if here and redo and not picking.only:  # those that can go on from their blocks first: they need the fewest;
        # last, those whose blocks so far say they would need more than their design allows (a saving too small to
        # time)
        jobs.sort(key=lambda job: (all(status.past_its_design(c, results, here) for c in job.cells),
                                   not any(status.blocks_on(c, results, here) for c in job.cells if c in redo)))
    if not jobs:
        say(f"{plan.path}: every cell has a result ({len(states)} cells); nothing to run.")
        return None
    estimates = estimates_of(jobs, results, redo, here)
    if limit and not picking.only:
        # under a time limit, the jobs that fit it whole first (each group on the order above), and last, whatever
        # they take, those past their design's most
        past_cells = {s.cell for s in wanted if s.past_design}
        first = windows.first_whole([job.id for job in jobs], estimates, limit,
                                    last={job.id for job in jobs if all(c in past_cells for c in job.cells)})
        jobs.sort(key=lambda job: first.index(job.id))
    # measured afresh: an old build's blocks timed another build; a census without a new fix lacks its arm
    rebuild = {s.cell for s in wanted if s.state in REMEASURED or (picking.again and s.state not in OWED)}
    lock = results / "campaigns" / f"{plan.name}.timing.lock" if exclusive_timing else None
    planned = [(job.id, _argv(job, results, redo, rebuild, lock), str(results / "logs" / plan.name / f"{job.id}.log"))
               for job in jobs]
    return Run(plan, results, where, jobs, estimates, planned, limit)


def _argv(job: Job, results: Path, redo: set[Cell], rebuild: set[Cell], lock: Path | None) -> list[str]:
    """The command line of `job` in a run: going on from what it has (`redo`), or afresh (`rebuild`)."""
    kind = job.cells[0].kind
    if kind == "calibrate":
        # its trials are independent: a calibration goes on from those it has where its settings and software are
        # the same (`lab calibrate --resume`), and starts afresh otherwise
        argv = job.argv(results) + ["--resume", "--replace"]
    elif kind == "history":
        # a history goes on by itself: it keeps each pair measured by its build and design, measures the rest
        argv = job.argv(results)
    else:
        # an undecided A/B goes on from its blocks where its design allows (`lab ab --resume`), else runs afresh
        again = ["--resume", "--replace"] if kind == "ab" else ["--replace"]
        argv = job.argv(results) + (again if redo & set(job.cells) else
                                    ["--replace"] if rebuild & set(job.cells) else [])
    if lock is not None and kind in ("ab", "sweep"):
        argv += ["--timing-lock", str(lock.resolve())]
    return argv


def dry_run(run: Run) -> list[str]:
    """The command lines a run would start, each with its log, and under a time limit what the limit would start if
    each job took its estimate (each on the worker free first)."""
    parallel = run.where.parallel
    starts = ({s.job: s for s in windows.one_run([j for j, _, _ in run.planned], run.estimates, run.limit, parallel)}
              if run.limit else {})
    lines = []
    for job_id, argv, log in run.planned:
        note = ""
        if run.limit:
            seconds, start = run.estimates[job_id].seconds, starts[job_id]
            on = f" on worker {start.worker + 1}" if parallel > 1 else ""
            note = (f"; about {duration(seconds)}, " + (
                f"{duration(start.at + seconds)} of {duration(run.limit)} by its end{on}" if start.how == "whole"
                else f"would start{on} and stop its {run.estimates[job_id].unit}s at the limit"
                if start.how == "part" else "would not start within the limit"))
        lines.append(f"{' '.join(argv)}    # log: {log}{note}")
    return lines


def short_budgets(estimates, say: Say) -> None:
    """Name the jobs whose budget buys fewer blocks than the rule needs to decide, or to call a change: they would
    spend their GPU time on an answer that cannot be one."""
    short = [e.warning for e in estimates if e.warning]
    if short:
        say(f"\nWarning: {len(short)} job(s) cannot decide within their budget (or can find the arms equivalent but "
            "not call a change); give their cells a larger `budget`:")
        for w in short:
            say(f"  {w}")


def execute(run: Run, log_path: Path, say: Say) -> int:
    """Run `run`'s jobs where it says, each job's end said and written to the run log at `log_path`; the exit code:
    130 after a Ctrl-C or with a job stopped at the time limit, 1 with a job failed, else 0."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"{run.plan.path}: {sum(len(j.cells) for j in run.jobs)} cell(s) in {len(run.jobs)} job(s) on "
        f"{run.where.describe()}")
    short_budgets(run.estimates.values(), say)
    started = time.time()
    finished: list[dict] = []
    cells_of = {job.id: job.cells for job in run.jobs}

    def done(job_id: str, outcome: dict) -> None:
        entry = {"job": job_id, "cells": [c.stem("*") for c in cells_of[job_id]], "where": run.where.describe(),
                 **outcome}
        with open(log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        finished.append(entry)
        say(f"[{len(finished)}/{len(run.jobs)}] {_ended(run, log_path, job_id, outcome)}")

    try:
        cluster.run(run.planned, run.where, run.plan.slurm, done, pin=True,
                    deadline=started + run.limit if run.limit else None,
                    fits=lambda job_id, left: _fits(run.estimates[job_id], job_id, left, say), progress=say)
    except KeyboardInterrupt:
        left = [job_id for job_id, _, _ in run.planned if job_id not in {e["job"] for e in finished}]
        say(f"\nInterrupted: {len(finished)} of {len(run.jobs)} job(s) ran (run log: {log_path}); not run: "
            + (", ".join(left) if left else "none") + ". `lab campaign run` again goes on from there.")
        return 130
    return _summary(run, finished, time.time() - started, log_path, say)


def _fits(estimate: Estimate, job_id: str, left: float, say: Say) -> bool:
    """Whether a job starts with `left` seconds of the time limit left: whole, or to stop at the limit keeping what it
    completed; said when it does not fit whole."""
    if windows.fits_whole(estimate, left):
        return True
    if windows.starts_in_part(estimate, left):
        again = "lab campaign run --redo-undecided" if estimate.unit == "block" else "lab campaign run"
        say(f"[time limit] {job_id}: about {duration(estimate.seconds)} in all ({estimate.basis}) with "
            f"{duration(max(left, 0.0))} left: it starts, stops its {estimate.unit}s before the limit and keeps them "
            f"(`{again}` goes on from them)")
        return True
    say(f"[time limit] {job_id}: not started, about {duration(estimate.seconds)} ({estimate.basis}) with "
        f"{duration(max(left, 0.0))} left"
        + (f"; even its shortest useful run (one {estimate.unit}) takes about {duration(estimate.least)}"
           if estimate.least else ""))
    return False


def _ended(run: Run, log_path: Path, job_id: str, outcome: dict) -> str:
    """How a finished job ended, with each of its cells' verdict (or state) as the results now say."""
    cells = next(job.cells for job in run.jobs if job.id == job_id)
    now = {s.cell: s for s in status.status(run.plan, run.results, measured.read_log(log_path))}
    verdicts = "; ".join(f"{cell_tag(c)}: {now[c].verdict or now[c].state}" for c in cells)
    took = duration(outcome["seconds"]) if outcome.get("seconds") else "?"
    if outcome.get("time_limit"):  # the campaign's own limit, not a Ctrl-C: the run ends as planned
        state = "STOPPED AT THE TIME LIMIT (what it completed is kept; `--redo-undecided` goes on from it)"
    elif outcome.get("interrupted"):
        state = "INTERRUPTED (what it completed is kept; run again to go on)"
    elif outcome["exit"] == 0:
        state = "done"
    else:
        state = f"FAILED ({outcome.get('error') or 'exit ' + str(outcome['exit'])})"
    return f"{job_id}: {state} in {took} — {verdicts}"


def _summary(run: Run, finished: list[dict], wall: float, log_path: Path, say: Say) -> int:
    """What the run measured, in how long, and under a time limit what stopped there and what did not start."""
    cells_of = {job.id: job.cells for job in run.jobs}
    busy = sum(e.get("seconds") or 0 for e in finished)
    n_cells = sum(len(cells_of[e["job"]]) for e in finished if e["exit"] == 0)
    failed = [e for e in finished if e["exit"] != 0 and not e.get("interrupted")]
    say(f"\n{n_cells} cell(s) measured in {duration(wall)} of wall time on {run.where.describe()}: "
        f"{n_cells / wall * 3600:.1f} cells per hour; the same jobs took {duration(busy)} of worker time "
        f"({n_cells / busy * 3600 if busy else 0:.1f} cells per hour one after another). "
        f"Run log: {log_path}" + (f"; {len(failed)} job(s) failed (see their logs)." if failed else "."))
    if run.limit:
        ran = {e["job"] for e in finished}
        stopped = [e["job"] for e in finished if e.get("time_limit")]
        left = [job_id for job_id, _, _ in run.planned if job_id not in ran]
        say(f"Time limit {duration(run.limit)}: " + (f"{', '.join(stopped)} stopped at the limit (what "
                                                     f"{'it' if len(stopped) == 1 else 'each'} completed is kept); "
                                                     if stopped else "")
            + (f"not run: {', '.join(left)}. `lab campaign run` again goes on from there." if left
               else "every job ran."))
        if stopped:
            return 130
    return 1 if failed else 0


def cell_tag(cell: Cell) -> str:
    """What a cell is called in the progress lines: its fix set, or for a script the file it writes."""
    if cell.kind == "script":
        return Path(cell.option("writes")).name
    return fix_tag(list(cell.fixes))

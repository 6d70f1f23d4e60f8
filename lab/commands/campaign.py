"""`lab campaign`: plan and run a campaign file (`campaigns/*.toml`): which cells exist, what the rest will take,
and measuring the missing ones here, on every GPU of this host, or on a Dask or Slurm cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from tabulate import tabulate

from lab.base import naming, outputs
from lab.base.errors import UsageError
from lab.commands._shared import progress

HELP = "plan or run a campaign file: the cells to measure, which exist, and the missing ones measured"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    plan = sub.add_parser("plan", help="list the cells: state, verdict, estimated time")
    plan.add_argument("file", type=Path, metavar="FILE", help="a campaign file (campaigns/*.toml)")
    plan.add_argument("--results", type=Path, default=Path("results"), help="results directory (default results/)")
    plan.add_argument("--json", action="store_true",
                      help="the cells, their jobs and their counts by what they time (`by_fixes`), as JSON")
    plan.add_argument("--time-limit", metavar="TIME",
                      help="also count the runs of TIME (`run --time-limit`, a lent machine's call) the jobs take, "
                           "and name those that cannot start in one")
    plan.add_argument("--workers", type=int, default=1, metavar="N",
                      help="with --time-limit: jobs at once in each run (`run --workers N` or N GPUs; default 1)")
    plan.add_argument("--gpu", metavar="KIND",
                      help="estimate as a run on this kind of GPU does (`h100`, `h200`: the tag in result names): "
                           "the results measured on it first")
    plan.add_argument("--redo-undecided", action="store_true",
                      help="plan what `run --redo-undecided` runs: the undecided cells too, each A/B going on from "
                           "its blocks (those at their design's most are an answer, and left out)")
    plan.add_argument("--within-design", action="store_true",
                      help="plan what `run --within-design` runs: without the cells past their design's most blocks")
    go = sub.add_parser("run", help="measure the cells that have no result (resumable)")
    go.add_argument("file", type=Path, metavar="FILE", help="a campaign file (campaigns/*.toml)")
    go.add_argument("--results", type=Path, default=Path("results"), help="results directory (default results/)")
    where = go.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N", help="N jobs at once on a local Dask cluster")
    where.add_argument("--gpus", metavar="all|0,1,..",
                       help="one job per GPU of this host at a time, each seeing only its GPU (a local Dask cluster)")
    where.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask cluster (tcp://host:8786)")
    where.add_argument("--slurm", type=int, metavar="JOBS", help="JOBS Slurm jobs of workers (dask-jobqueue, [slurm])")
    go.add_argument("--only", metavar="TEXT", action="append",
                    help="only the cells whose label, or the job `lab campaign plan` lists them in, contains TEXT "
                         "(repeat: any of them, run in the order given)")
    go.add_argument("--skip", metavar="TEXT", action="append",
                    help="leave out the cells whose label, or job, contains TEXT (repeat: any of them; after --only)")
    go.add_argument("--again", action="store_true",
                    help="measure the cells picked afresh even where they have a result (--replace), for example a "
                         "census measured before it recorded what it records now; needs --only")
    go.add_argument("--redo-undecided", action="store_true",
                    help="run undecided cells again: an A/B goes on from its blocks where it can (`lab ab --resume`), "
                         "anything else runs afresh (--replace); an A/B undecided at its design's most blocks is an "
                         "answer and is left alone (`--again --only TEXT` measures it afresh)")
    go.add_argument("--within-design", action="store_true",
                    help="leave out the cells `lab campaign plan` puts past their design's most blocks: a planned A/B "
                         "whose fixes, if they change nothing, the calls at its setting would need more blocks to "
                         "find within the margin, and an undecided one whose blocks so far say so")
    go.add_argument("--exclusive-timing", action="store_true",
                    help="cells that share a host take turns to profile and time (a lock file), while the rest of "
                         "their work runs side by side")
    go.add_argument("--time-limit", metavar="TIME",
                    help="on this host (one after another, or --workers/--gpus), within TIME (90s, 10m, 1.5h): a "
                         "job starts only if its estimate (`lab campaign plan`) fits in what is left (an A/B: "
                         "if one block does, its blocks stopping before the limit), and those "
                         "running at the limit stop as by a Ctrl-C, keeping what they completed; leave a minute under "
                         "a hard limit for them to write")
    go.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


class _Refused(Exception):
    pass


class _Checking(argparse.ArgumentParser):
    """A subcommand's own parser that raises instead of exiting."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise _Refused(message)


def check_options(plan) -> None:
    """Every cell's options against its subcommand's own parser, before anything runs: an unknown key or a bad value
    is one error naming the file, the cell and the option (it used to fail in the job, with the reason in its log)."""
    import importlib

    from lab.campaigns import campaign

    parsers = {}
    for job in campaign.jobs(list(plan.cells)):
        cell = job.cells[0]
        if cell.kind == "script":
            continue
        if cell.kind not in parsers:
            parsers[cell.kind] = _Checking(prog=f"lab {cell.kind}", add_help=False)
            importlib.import_module(f"lab.commands.{cell.kind}").add_arguments(parsers[cell.kind])
        argv = job.argv(Path("results"))
        try:
            parsers[cell.kind].parse_args(argv[argv.index(cell.kind) + 1:])
        except _Refused as e:
            raise UsageError(f"{plan.path}: [[cell]] number {cell.group} ({cell.label}): `lab {cell.kind}` refuses "
                             f"its options: {e}. (A key `max_blocks = 30` is the option `--max-blocks 30`; `lab "
                             f"{cell.kind} --help` lists them.)") from None


def check_settings(plan) -> None:
    """Every cell's setting against its pipeline, as `lab` checks it before a build (the device aside: the file may be
    planned on another machine): a cell the lab would refuse is one error naming the file, the cell and the reason,
    before anything runs (it used to run, and fail in its job)."""
    from lab.run import settings
    from lab.run.scenario import get_scenario, setting_target

    asked: set[tuple[str, str]] = set()
    for cell in plan.cells:
        text = cell.option("setting")
        if not text or (cell.pipeline, text) in asked:
            continue
        asked.add((cell.pipeline, text))
        for setting in settings.parse_all([text]):
            why = settings.refusal(setting, setting_target(get_scenario(cell.pipeline)), None)
            if why:
                raise UsageError(f"{plan.path}: [[cell]] number {cell.group} ({cell.label}): `--setting "
                                 f"{setting.name}` cannot run on `{cell.pipeline}`: {why}. Take it out of the cell.")


def run(args: argparse.Namespace) -> int:
    from lab.campaigns import campaign

    plan = campaign.load(args.file)
    check_options(plan)
    check_settings(plan)
    log_path = args.results / "campaigns" / f"{plan.name}.jsonl"
    if args.action == "run" and not args.dry_run:  # where the results, the jobs' logs and the run log go, first
        outputs.check(args.results, [log_path.relative_to(args.results), Path("logs") / plan.name / "job.log"],
                      option="--results")
    states = campaign.status(plan, args.results, campaign.read_log(log_path))
    if args.action == "plan":
        return _plan(plan, states, args)
    return _run(plan, states, args, log_path)


def _plan(plan, states, args) -> int:
    from lab.base.units import duration
    from lab.campaigns import campaign
    from lab.results import states as cell_states

    wanted = _to_run(states, args.redo_undecided, args.within_design)
    missing = [s.cell for s in wanted]
    redo = _going_on(wanted)
    jobs = campaign.jobs(missing)
    limit = _parse_limit(args.time_limit) if args.time_limit else None
    if args.workers < 1:
        raise UsageError("`--workers` must be at least 1.")
    gpu = _gpu_kind(args.gpu, args.results) if args.gpu else None
    estimates = {job.id: campaign.estimate(job, args.results, resume=bool(redo & set(job.cells)), device=gpu)
                 for job in jobs}
    by_cell = {c: (job.id, estimates[job.id]) for job in jobs for c in job.cells}
    if args.json:
        runs = None
        if limit:
            from lab.campaigns import windows

            counted = windows.runs_needed([job.id for job in jobs], estimates, limit, args.workers)
            runs = {"limit_s": limit, "workers": args.workers, **dataclasses.asdict(counted)}
        print(json.dumps({"campaign": str(plan.path), "device": plan.device, "cells": [
            {"label": s.cell.label, "state": s.state, "verdict": s.verdict,
             "result": str(s.result) if s.result else None, "detail": s.detail, "at_limit": s.at_limit,
             "past_design": s.past_design, "job": by_cell.get(s.cell, (None,))[0]} for s in states],
            "by_fixes": cell_states.by_fixes(states),
            "jobs": [{"id": j.id, "command": " ".join(j.argv(args.results)), "seconds": estimates[j.id].seconds,
                      "basis": estimates[j.id].basis} for j in jobs], "runs": runs}, indent=1))
        return 0
    rows = [[i, s.cell.label, s.state, (f"{s.verdict}; {s.detail}" if s.state == "undecided" and s.detail else
                                        s.verdict or s.detail or ""), by_cell.get(s.cell, ("",))[0]]
            for i, s in enumerate(states, start=1)]
    print(f"{plan.path}: {plan.description}\n")
    print(tabulate(rows, headers=["#", "cell", "state", "verdict", "job"], maxcolwidths=[None, 70, None, 40, 50]))
    print(f"\n{cell_states.summary(states, zeros=True)}.")
    if kinds := cell_states.by_fixes(states):
        print("A/B cells by what they time: " + "; ".join(kinds) + ".")
    if jobs:
        total = sum(e.seconds for e in estimates.values())
        print(f"\nThe {len(missing) - len(redo)} cells without a result (or with one of the old build, or a census "
              "without a new fix)" + (f" and {len(redo)} undecided going on from their blocks" if args.redo_undecided
                                      else "")
              + (", within their design's most blocks," if args.within_design else "")
              + f" run as {len(jobs)} job(s), about {duration(total)} on one "
              "GPU (at most: sequential cells counted at their limit):")
        for job in jobs:
            e = estimates[job.id]
            print(f"  {job.id}: about {duration(e.seconds)} ({e.basis})")
        if past := {s.cell for s in wanted if s.past_design}:  # (with `--redo-undecided`, the undecided too)
            rest = campaign.jobs([c for c in missing if c not in past])
            seconds = sum(campaign.estimate(job, args.results, resume=bool(redo & set(job.cells)), device=gpu).seconds
                          for job in rest)
            print(f"Without the {len(past)} cell(s) likely past their design's most (a fix of no effect there ends "
                  f"undecided at its budget, its syncs and copies counted by its profiles), "
                  + (f"about {duration(seconds)} in {len(rest)} job(s)." if rest else "nothing is left to run."))
        if limit:
            _say_runs(jobs, estimates, limit, args.workers, print)
        _warn_short_budgets(estimates.values(), print)
    return 0


def _say_runs(jobs, estimates, limit: float, workers: int, say) -> None:
    """How many runs of `limit` seconds on `workers` workers the owed jobs take (`windows.runs_needed`), and which
    cannot start in one."""
    from lab.base.units import duration
    from lab.campaigns import windows

    runs = windows.runs_needed([job.id for job in jobs], estimates, limit, workers)
    on = f"{workers} workers" if workers > 1 else "one worker"
    say(f"\nIn runs of {duration(limit)} on {on} (`run --time-limit`, fit-whole jobs first): about "
        + (f"{runs.runs} run(s)" if not runs.capped else f"more than {windows.MAX_RUNS} runs")
        + f"; {runs.stopped} time(s) a job stops at the limit and goes on in the next, spending about "
        f"{duration(runs.again_s)} again on its build and set-up.")
    if runs.never:
        say(f"{len(runs.never)} job(s) cannot start in such a run, even to stop at its limit (a longer run can):")
        for job_id in runs.never:
            e = estimates[job_id]
            first = "a first profiled pair or block" if e.unit == "block" else f"a first {e.unit}"
            say(f"  {job_id}: about {duration(e.seconds)}" + (
                f", its shortest useful run (its build, set-up and {first}) about {duration(e.least)}"
                if e.least is not None else ", and it keeps nothing at a limit: it must fit whole"))
    if runs.stuck:
        say(f"{len(runs.stuck)} job(s) start in such a run but get no further in the next: each run repeats its build "
            "and set-up, and what is left of the run holds no " + ("block" if all(
                estimates[j].unit == "block" for j in runs.stuck) else "step") + " (a longer run can):")
        for job_id in runs.stuck:
            e = estimates[job_id]
            say(f"  {job_id}: about {duration(e.seconds)}; a run going on spends about {duration(e.again)} again "
                f"before its first {e.unit} of about {duration(e.step)}")


def _warn_short_budgets(estimates, say) -> None:
    """Name the jobs whose budget buys fewer blocks than the rule needs to decide, or to call a change: they would
    spend their GPU time on an answer that cannot be one."""
    short = [e.warning for e in estimates if e.warning]
    if short:
        say(f"\nWarning: {len(short)} job(s) cannot decide within their budget (or can find the arms equivalent but not "
            f"call a change); give their cells a larger `budget`:")
        for w in short:
            say(f"  {w}")


def _where(args):
    from lab.campaigns.cluster import Where

    if args.gpus:
        gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus != "all" else _all_gpus()
        if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
            raise UsageError(f"`--gpus {args.gpus}`: expected `all` or distinct GPU numbers such as 0,1.")
        return Where(gpus=tuple(gpus))
    if args.workers is not None and args.workers < 1:
        raise UsageError("`--workers` must be at least 1.")
    return Where(workers=args.workers, scheduler=args.scheduler, slurm=args.slurm)


def _gpu_kind(kind: str, results: Path) -> str:
    """`--gpu KIND`, a GPU tag that some A/B result under `results` was measured on."""
    from lab.campaigns import campaign

    known = sorted({campaign.device_of(p.stem) for p in (results / "ab").glob("*/*.json")} - {"cpu"})
    if kind not in known:
        raise UsageError(f"`--gpu {kind}`: no A/B result under {results} was measured on such a GPU; the kinds there "
                         f"are {', '.join(known) or 'none'} (the tag that ends a result's name).")
    return kind


def _gpu_here(device: str) -> str | None:
    """This host's GPU tag (`h100`, `h200`) for a campaign on `cuda`, None without one (planning on a CPU host).
    Asked of `nvidia-smi`, not torch: the campaign's own process must not hold a CUDA context beside its jobs."""
    if not device.startswith("cuda"):
        return None
    import subprocess

    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return naming.device_tag_of(names[0].strip()) if names and names[0].strip() else None


def _all_gpus() -> list[str]:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise UsageError("`--gpus all`: torch sees no GPU on this host; use --workers N for CPU workers.")
    return [str(i) for i in range(n)]


def _to_run(states, redo_undecided: bool, within_design: bool) -> list:
    """The cells `run` measures with those flags (before `--only` and `--skip`), `plan`'s too: those owed a result,
    and with `redo_undecided` the undecided ones not at their design's most; with `within_design`, not those past
    it."""
    from lab.results import states as cell_states

    return [s for s in states if (s.state in cell_states.OWED
                                  or (redo_undecided and s.state == "undecided" and not s.at_limit))
            and not (within_design and s.past_design)]


def _going_on(wanted) -> set:
    """The cells of `wanted` that go on from what they have (`lab ab --resume`): the undecided ones, and an A/B with
    profiles and no block yet."""
    from lab.results import states as cell_states

    return {s.cell for s in wanted if s.state == "undecided" or s.verdict == cell_states.NO_BLOCKS_YET}


def _run(plan, states, args, log_path: Path) -> int:
    from lab.base.units import duration
    from lab.campaigns import campaign, cluster, windows
    from lab.results import states as cell_states

    if args.again and not args.only:
        raise UsageError("`--again` measures afresh cells that have a result: pick them with `--only TEXT` "
                         f"(`lab campaign plan {plan.path}` lists their labels and jobs).")
    wanted = list(states) if args.again else _to_run(states, args.redo_undecided, within_design=False)
    # a cell's label, or the job `lab campaign plan` lists it in (`ab-flux-eager-full-lora-3sets-g1`), or the job it
    # runs in here: with `--redo-undecided` an undecided cell joins the owed ones of its build, and their job's id
    # (which counts its cells) is not the one `plan` listed
    job_of: dict = {}
    for cells in ([s.cell for s in states if s.state in cell_states.OWED], [s.cell for s in wanted]):
        for job in campaign.jobs(cells):
            for c in job.cells:
                job_of.setdefault(c, set()).add(job.id)

    def picked(text: str, pool: list) -> list:
        return [s for s in pool if text in s.cell.label or any(text in id_ for id_ in job_of.get(s.cell, ()))]

    if args.only:
        # in the order of the texts, so that the cells that matter most run first when time is short
        wanted = list({s.cell: s for text in args.only for s in picked(text, wanted)}.values())
        if not wanted and not [s for text in args.only for s in picked(text, states)]:
            raise UsageError(f"`--only {' / '.join(args.only)}` matches none of the {len(states)} cells of "
                             f"{plan.path} (`lab campaign plan {plan.path}` lists their labels and jobs).")
        for text in args.only:  # one text of several that picks nothing: most often a job id gone stale
            if not picked(text, states):
                progress(f"Warning: `--only {text}` matches no cell of {plan.path}: a job's id counts the cells it "
                         "has left, so an id from an earlier plan goes stale as cells are measured; a cell's label "
                         f"text does not (`lab campaign plan {plan.path}` lists both).")
    if args.skip:
        left_out = {s.cell for text in args.skip for s in picked(text, wanted)}
        wanted = [s for s in wanted if s.cell not in left_out]
    if args.within_design and (past := [s for s in wanted if s.past_design]):
        wanted = [s for s in wanted if s not in past]
        progress(f"--within-design: leaving out {len(past)} cell(s) likely past their design's most blocks "
                 f"(`lab campaign plan {plan.path}` says why beside each)")
        if not wanted:
            progress(f"{plan.path}: every cell left to run is past its design's most; nothing to run (without "
                     "`--within-design` they run).")
            return 0
    redo = set() if args.again else _going_on(wanted)
    # measured afresh: an old build's blocks timed another build; a census without a new fix lacks its arm
    rebuild = {s.cell for s in wanted
               if s.state in (cell_states.OLD_BUILD, cell_states.ONE_PAIR, cell_states.NEW_FIXES)
               or (args.again and s.state not in cell_states.OWED)}
    jobs = campaign.jobs([s.cell for s in wanted])
    where = _where(args)
    limit = _time_limit(args, where)
    # the GPU the jobs run on, where they run here: an undecided A/B goes on only from blocks measured on it
    here = _gpu_here(plan.device) if not (where.scheduler or where.slurm) else None
    if here and redo and not args.only:  # those that can go on from their blocks first: they need the fewest; last,
        # those whose blocks so far say they would need more than their design allows (a saving too small to time)
        jobs.sort(key=lambda job: (all(campaign.past_its_design(c, args.results, here) for c in job.cells),
                                   not any(campaign.blocks_on(c, args.results, here) for c in job.cells if c in redo)))
    if not jobs:
        progress(f"{plan.path}: every cell has a result ({len(states)} cells); nothing to run.")
        return 0
    estimates = {job.id: campaign.estimate(job, args.results, resume=bool(redo & set(job.cells)), device=here)
                 for job in jobs}
    if limit and not args.only:
        # under a time limit, the jobs that fit it whole first (each group on the order above), and last, whatever
        # they take, those past their design's most
        past = {s.cell for s in wanted if s.past_design}
        first = windows.first_whole([job.id for job in jobs], estimates, limit,
                                    last={job.id for job in jobs if all(c in past for c in job.cells)})
        jobs.sort(key=lambda job: first.index(job.id))
    lock = args.results / "campaigns" / f"{plan.name}.timing.lock"
    planned = []
    for job in jobs:
        # an undecided A/B goes on from its blocks where its design allows (`lab ab --resume`), else runs afresh
        again = (["--resume", "--replace"] if job.cells[0].kind == "ab" else ["--replace"])
        if job.cells[0].kind == "calibrate":
            # its trials are independent: a calibration goes on from those it has where its settings and software
            # are the same (`lab calibrate --resume`), and starts afresh otherwise
            argv = job.argv(args.results) + ["--resume", "--replace"]
        elif job.cells[0].kind == "history":
            # a history goes on by itself: it keeps each pair measured by its build and design, measures the rest
            argv = job.argv(args.results)
        else:
            argv = job.argv(args.results) + (again if redo & set(job.cells) else
                                             ["--replace"] if rebuild & set(job.cells) else [])
        if args.exclusive_timing and job.cells[0].kind in ("ab", "sweep"):
            argv += ["--timing-lock", str(lock.resolve())]
        log = args.results / "logs" / plan.name / f"{job.id}.log"
        planned.append((job.id, argv, str(log)))
    if args.dry_run:
        # what the limit would start, if each job took its estimate: each on the worker free first
        starts = ({s.job: s for s in windows.one_run([j for j, _, _ in planned], estimates, limit, where.parallel)}
                  if limit else {})
        for job_id, argv, log in planned:
            note = ""
            if limit:
                seconds, start = estimates[job_id].seconds, starts[job_id]
                where_ = f" on worker {start.worker + 1}" if where.parallel > 1 else ""
                note = (f"; about {duration(seconds)}, " + (
                    f"{duration(start.at + seconds)} of {duration(limit)} by its end{where_}" if start.how == "whole"
                    else f"would start{where_} and stop its {estimates[job_id].unit}s at the limit"
                    if start.how == "part" else "would not start within the limit"))
            print(f"{' '.join(argv)}    # log: {log}{note}")
        return 0
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cells_of = {job.id: job.cells for job in jobs}
    progress(f"{plan.path}: {sum(len(j.cells) for j in jobs)} cell(s) in {len(jobs)} job(s) on {where.describe()}")
    _warn_short_budgets(estimates.values(), progress)
    started = time.time()
    finished: list[dict] = []

    def fits(job_id: str, left: float) -> bool:
        estimate = estimates[job_id]
        if windows.fits_whole(estimate, left):
            return True
        if windows.starts_in_part(estimate, left):
            again = "lab campaign run --redo-undecided" if estimate.unit == "block" else "lab campaign run"
            progress(f"[time limit] {job_id}: about {duration(estimate.seconds)} in all ({estimate.basis}) with "
                     f"{duration(max(left, 0.0))} left: it starts, stops its {estimate.unit}s before the limit and "
                     f"keeps them (`{again}` goes on from them)")
            return True
        progress(f"[time limit] {job_id}: not started, about {duration(estimate.seconds)} "
                 f"({estimate.basis}) with {duration(max(left, 0.0))} left"
                 + (f"; even its shortest useful run (one {estimate.unit}) takes about {duration(estimate.least)}"
                    if estimate.least else ""))
        return False

    def done(job_id: str, outcome: dict) -> None:
        cells = cells_of[job_id]
        entry = {"job": job_id, "cells": [c.stem("*") for c in cells], "where": where.describe(), **outcome}
        with open(log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        finished.append(entry)
        now = {s.cell: s for s in campaign.status(plan, args.results, campaign.read_log(log_path))}
        verdicts = "; ".join(f"{naming_tag(c)}: {now[c].verdict or now[c].state}" for c in cells)
        took = duration(outcome["seconds"]) if outcome.get("seconds") else "?"
        if outcome.get("time_limit"):  # the campaign's own limit, not a Ctrl-C: the run ends as planned
            state = "STOPPED AT THE TIME LIMIT (what it completed is kept; `--redo-undecided` goes on from it)"
        elif outcome.get("interrupted"):
            state = "INTERRUPTED (what it completed is kept; run again to go on)"
        elif outcome["exit"] == 0:
            state = "done"
        else:
            state = f"FAILED ({outcome.get('error') or 'exit ' + str(outcome['exit'])})"
        progress(f"[{len(finished)}/{len(jobs)}] {job_id}: {state} in {took} — {verdicts}")

    try:
        cluster.run(planned, where, plan.slurm, done, pin=True,
                    deadline=started + limit if limit else None, fits=fits, progress=progress)
    except KeyboardInterrupt:
        left = [job_id for job_id, _, _ in planned if job_id not in {e["job"] for e in finished}]
        progress(f"\nInterrupted: {len(finished)} of {len(jobs)} job(s) ran (run log: {log_path}); not run: "
                 + (", ".join(left) if left else "none") + ". `lab campaign run` again goes on from there.")
        return 130
    wall = time.time() - started
    busy = sum(e.get("seconds") or 0 for e in finished)
    n_cells = sum(len(cells_of[e["job"]]) for e in finished if e["exit"] == 0)
    failed = [e for e in finished if e["exit"] != 0 and not e.get("interrupted")]
    progress(f"\n{n_cells} cell(s) measured in {duration(wall)} of wall time on {where.describe()}: "
             f"{n_cells / wall * 3600:.1f} cells per hour; the same jobs took {duration(busy)} of worker time "
             f"({n_cells / busy * 3600 if busy else 0:.1f} cells per hour one after another). "
             f"Run log: {log_path}" + (f"; {len(failed)} job(s) failed (see their logs)." if failed else "."))
    if limit:
        ran = {e["job"] for e in finished}
        stopped = [e["job"] for e in finished if e.get("time_limit")]
        left = [job_id for job_id, _, _ in planned if job_id not in ran]
        progress(f"Time limit {duration(limit)}: " + (f"{', '.join(stopped)} stopped at the limit (what "
                                                      f"{'it' if len(stopped) == 1 else 'each'} completed is kept); "
                                                      if stopped else "")
                 + (f"not run: {', '.join(left)}. `lab campaign run` again goes on from there." if left
                    else "every job ran."))
        if stopped:
            return 130
    return 1 if failed else 0


def _time_limit(args, where) -> float | None:
    """`--time-limit` in seconds, checked: it runs the jobs on this host (one after another, `--workers` or
    `--gpus`)."""
    if not args.time_limit:
        return None
    if where.scheduler or where.slurm:
        raise UsageError(f"`--time-limit` runs the jobs on this host, not on {where.describe()} (give the "
                         "cluster's workers their own limit: a Slurm walltime, say).")
    return _parse_limit(args.time_limit)


def _parse_limit(text: str) -> float:
    from lab.base.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise UsageError(f"`--time-limit {text}`: {e}") from None


def naming_tag(cell) -> str:
    """What a cell is called in the progress lines: its fix set, or for a script the file it writes."""
    from lab.base.naming import fix_tag

    if cell.kind == "script":
        return Path(cell.option("writes")).name
    return fix_tag(list(cell.fixes))

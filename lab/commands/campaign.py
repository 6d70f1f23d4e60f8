"""`lab campaign`: plan and run a campaign file (`campaigns/*.toml`): which cells exist, what the rest will take,
and measuring the missing ones here, on every GPU of this host, or on a Dask or Slurm cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from tabulate import tabulate

from lab.base import outputs
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
    is one error naming the file, the cell and the option, rather than a failure in the job with the reason in its
    log."""
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


def run(args: argparse.Namespace) -> int:
    from lab.campaigns import campaign

    plan = campaign.load(args.file)
    check_options(plan)
    campaign.check_settings(plan)
    log_path = args.results / "campaigns" / f"{plan.name}.jsonl"
    if args.action == "run" and not args.dry_run:  # where the results, the jobs' logs and the run log go, first
        outputs.check(args.results, [log_path.relative_to(args.results), Path("logs") / plan.name / "job.log"],
                      option="--results")
    states = campaign.status(plan, args.results, campaign.read_log(log_path))
    if args.action == "plan":
        return _plan(plan, states, args)
    return _run(plan, states, args, log_path)


def _plan(plan, states, args) -> int:
    from lab.campaigns import campaign, running

    wanted = running.to_run(states, args.redo_undecided, args.within_design)
    missing = [s.cell for s in wanted]
    redo = running.going_on(wanted)
    jobs = campaign.jobs(missing)
    limit = _parse_limit(args.time_limit) if args.time_limit else None
    if args.workers < 1:
        raise UsageError("`--workers` must be at least 1.")
    gpu = _gpu_kind(args.gpu, args.results) if args.gpu else None
    estimates = running.estimates_of(jobs, args.results, redo, gpu)
    by_cell = {c: (job.id, estimates[job.id]) for job in jobs for c in job.cells}
    if args.json:
        _print_json(plan, states, jobs, estimates, by_cell, limit, args)
        return 0
    _print_plan(plan, states, by_cell)
    if jobs:
        _print_jobs(jobs, estimates, wanted, missing, redo, limit, gpu, args)
    return 0


def _print_json(plan, states, jobs, estimates, by_cell, limit, args) -> None:
    from lab.campaigns import windows
    from lab.results import states as cell_states

    runs = None
    if limit:
        counted = windows.runs_needed([job.id for job in jobs], estimates, limit, args.workers)
        runs = {"limit_s": limit, "workers": args.workers, **dataclasses.asdict(counted)}
    print(json.dumps({"campaign": str(plan.path), "device": plan.device, "cells": [
        {"label": s.cell.label, "state": s.state, "verdict": s.verdict,
         "result": str(s.result) if s.result else None, "detail": s.detail, "at_limit": s.at_limit,
         "past_design": s.past_design, "job": by_cell.get(s.cell, (None,))[0]} for s in states],
        "by_fixes": cell_states.by_fixes(states),
        "jobs": [{"id": j.id, "command": " ".join(j.argv(args.results)), "seconds": estimates[j.id].seconds,
                  "expected_seconds": estimates[j.id].expected, "basis": estimates[j.id].basis} for j in jobs], "runs": runs}, indent=1))


def _print_plan(plan, states, by_cell) -> None:
    from lab.results import states as cell_states
    from lab.results.states import State

    rows = [[i, s.cell.label, s.state, (f"{s.verdict}; {s.detail}" if s.state == State.UNDECIDED and s.detail else
                                        s.verdict or s.detail or ""), by_cell.get(s.cell, ("",))[0]]
            for i, s in enumerate(states, start=1)]
    print(f"{plan.path}: {plan.description}\n")
    print(tabulate(rows, headers=["#", "cell", "state", "verdict", "job"], maxcolwidths=[None, 70, None, 40, 50]))
    print(f"\n{cell_states.summary(states, zeros=True)}.")
    if kinds := cell_states.by_fixes(states):
        print("A/B cells by what they time: " + "; ".join(kinds) + ".")


def _print_jobs(jobs, estimates, wanted, missing, redo, limit, gpu, args) -> None:
    from lab.base.units import duration
    from lab.campaigns import campaign, running

    total = sum(e.seconds for e in estimates.values())
    print(f"\nThe {len(missing) - len(redo)} cells without a result (or with one of the old build, or a census "
          "without a new fix)" + (f" and {len(redo)} undecided going on from their blocks" if args.redo_undecided
                                  else "")
          + (", within their design's most blocks," if args.within_design else "")
          + f" run as {len(jobs)} job(s), about {duration(total)} on one "
          "GPU (at most: sequential cells counted at their limit" + _expected(estimates.values(), total) + "):")
    for job in jobs:
        e = estimates[job.id]
        print(f"  {job.id}: about {duration(e.seconds)} ({e.basis})")
    if past := {s.cell for s in wanted if s.past_design}:  # (with `--redo-undecided`, the undecided too)
        rest = campaign.jobs([c for c in missing if c not in past])
        left = running.estimates_of(rest, args.results, redo, gpu).values()
        seconds = sum(e.seconds for e in left)
        print(f"Without the {len(past)} cell(s) likely past their design's most (a fix of no effect there ends "
              f"undecided at its budget, its syncs and copies counted by its profiles), "
              + (f"about {duration(seconds)} in {len(rest)} job(s){_expected(left, seconds)}." if rest
                 else "nothing is left to run."))
    if beyond := [s for s in wanted if s.beyond_budget_s and not s.past_design]:
        more = sum(s.beyond_budget_s for s in beyond)
        print(f"Those times count one budget a cell; {len(beyond)} cell(s) within their design need more runs than "
              f"one to find their fixes of no effect (`run --redo-undecided` goes on from their blocks): about "
              f"{duration(more)} more of their blocks at their settings' calls, the most of them "
              + ", ".join(f"{s.cell.label} ({duration(s.beyond_budget_s)})"
                          for s in sorted(beyond, key=lambda s: -s.beyond_budget_s)[:3]) + ".")
    if limit:
        _say_runs(jobs, estimates, limit, args.workers, print)
    running.short_budgets(estimates.values(), print)


def _expected(estimates, total: float) -> str:
    """The words for the time the jobs are expected to take where some of their cells are planned from results that
    decided a change (`lab.campaigns.estimates._expected_blocks`), "" where none is."""
    from lab.base.units import duration

    if not any(e.expected is not None for e in estimates):
        return ""
    expected = sum(e.seconds if e.expected is None else e.expected for e in estimates)
    return (f"; about {duration(expected)} where the cells planned from a result that decided a change (some of their "
            "fixes alone, or the cell on another GPU) stop at the blocks that result took" if expected < total else "")


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


def _all_gpus() -> list[str]:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise UsageError("`--gpus all`: torch sees no GPU on this host; use --workers N for CPU workers.")
    return [str(i) for i in range(n)]


def _run(plan, states, args, log_path: Path) -> int:
    from lab.campaigns import cluster, running

    where = _where(args)
    limit = _time_limit(args, where)
    picking = running.Picking(again=args.again, only=tuple(args.only or ()), skip=tuple(args.skip or ()),
                              redo_undecided=args.redo_undecided, within_design=args.within_design)
    # the GPU the jobs run on, where they run here: an undecided A/B goes on only from blocks measured on it
    here = cluster.gpu_tag(plan.device) if not (where.scheduler or where.slurm) else None
    prepared = running.prepare(plan, states, args.results, picking, where, limit, here, args.exclusive_timing,
                               progress)
    if prepared is None:
        return 0
    if args.dry_run:
        print("\n".join(running.dry_run(prepared)))
        return 0
    return running.execute(prepared, log_path, progress)


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

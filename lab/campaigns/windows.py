"""How a campaign's jobs fill runs of a fixed length (`lab campaign run --time-limit`, a lent machine's call): which
start and end within a run, which start and stop at its limit to go on in the next, which cannot start at all, and
how many such runs the jobs take. Pure: it reads the jobs' estimates (`campaign.Estimate`), never a result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

#: seconds a job that stops at the limit keeps free to write its result: it starts only if its shortest useful run
#: fits with this to spare (`lab ab` stops its blocks 30 s before the limit, and writing takes some of the rest)
SPARE_S = 60.0
#: seconds before the limit at which a job that stops there ends its work (`lab.measure.ab.DEADLINE_MARGIN_S`)
STOP_S = 30.0


class Timed(Protocol):
    seconds: float  # the whole job
    least: float | None  # its shortest useful run (None: it keeps nothing at the limit, and must fit whole)
    again: float  # what a run that goes on from it repeats (an A/B's build and set-up; its profiles are kept)


def fits_whole(estimate: Timed, left: float) -> bool:
    return estimate.seconds <= left


def starts_in_part(estimate: Timed, left: float) -> bool:
    """Whether a job that does not fit whole in `left` seconds still starts: one that keeps what it did at the limit
    (an A/B's blocks, a calibration's trials), where its shortest useful run fits with `SPARE_S` to spare."""
    return estimate.least is not None and estimate.least + SPARE_S <= left


def first_whole(ids: list[str], estimates: dict[str, Timed], limit: float, last: set[str] = frozenset()) -> list[str]:
    """`ids` with the jobs that fit `limit` whole first, each group in the order given: a job that only stops at the
    limit goes on in a later run, its set-up again, and where it goes first it takes the time of jobs that would have
    ended (an 8-minute call on two H200s, 2026-11-28, ran two such jobs to the limit and never started three that
    were estimated at 2 to 6 minutes). The jobs in `last` (those past their design's most) go after all the others,
    whatever they take: their time is better given to cells that can decide."""
    return sorted(ids, key=lambda i: (i in last, not fits_whole(estimates[i], limit)))


@dataclass(frozen=True)
class Start:
    job: str
    how: str  # "whole", "part" (stops its blocks or trials at the limit) or "not" (does not start in this run)
    worker: int  # 0-based; -1 where it does not start
    at: float  # seconds into the run where it starts


def one_run(ids: list[str], estimates: dict[str, Timed], limit: float, workers: int = 1,
            seconds: dict[str, float] | None = None) -> list[Start]:
    """What one run of `limit` seconds on `workers` workers starts, in the order of `ids`: each job on the worker free
    first, if its estimate (or what is left of it, `seconds`) fits what is left of the run, or if its shortest useful
    run does, when it stops at the limit and that worker is done. As `lab campaign run` starts them, if each job took
    its estimate."""
    free = [0.0] * max(1, workers)
    starts = []
    for job in ids:
        k = free.index(min(free))
        left = limit - free[k]
        whole = (seconds or {}).get(job, estimates[job].seconds)
        if whole <= left:
            starts.append(Start(job, "whole", k, free[k]))
            free[k] += whole
        elif starts_in_part(estimates[job], left):
            starts.append(Start(job, "part", k, free[k]))
            free[k] = limit
        else:
            starts.append(Start(job, "not", -1, free[k]))
    return starts


@dataclass
class Runs:
    runs: int = 0  # runs until every job that can start has ended
    stopped: int = 0  # times a job stopped at a limit and went on in a later run
    again_s: float = 0.0  # seconds those runs spent again on what a run that goes on repeats
    never: list[str] = field(default_factory=list)  # jobs that cannot start in a run of this length, even in part
    capped: bool = False  # stopped counting at `MAX_RUNS` (an estimate too large to be worth counting)


MAX_RUNS = 10_000


def runs_needed(ids: list[str], estimates: dict[str, Timed], limit: float, workers: int = 1) -> Runs:
    """How many runs of `limit` seconds on `workers` workers the jobs `ids` take, one run after another, each started
    as `lab campaign run --time-limit` starts it (`first_whole`, `one_run`): a job that stops at the limit has done
    what fitted, less `STOP_S`, and goes on in the next run, repeating its `again` (build and set-up). A job that
    cannot start in a run of this length even in part is counted apart (`never`), not run. An estimate, as good as
    the estimates it adds up."""
    left = {i: estimates[i].seconds for i in ids}
    out = Runs(never=[i for i in ids if not (fits_whole(estimates[i], limit) or starts_in_part(estimates[i], limit))])
    for i in out.never:
        del left[i]
    while left and out.runs < MAX_RUNS:
        out.runs += 1
        order = sorted(left, key=lambda i: (left[i] > limit, ids.index(i)))
        for start in one_run(order, estimates, limit, workers, left):
            if start.how == "whole":
                del left[start.job]
            elif start.how == "part":
                done, again = limit - start.at - STOP_S, estimates[start.job].again
                if done <= again:  # a run that would only repeat its set-up: it never gets further
                    out.never.append(start.job)
                    del left[start.job]
                    continue
                left[start.job] += again - done
                out.stopped += 1
                out.again_s += again
    out.capped = bool(left)
    return out

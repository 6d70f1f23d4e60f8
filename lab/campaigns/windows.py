"""How a campaign's jobs fill runs of a fixed length (`lab campaign run --time-limit`, a lent machine's call): which
start and end within a run, which start and stop at its limit to go on in the next, which cannot start at all, and
how many such runs the jobs take. Pure: it reads the jobs' estimates (`campaign.Estimate`), never a result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

#: seconds a job that stops at the limit keeps free to write its result: it starts only if its shortest useful run
#: fits with this to spare (`lab ab` stops its blocks `STOP_S` before the limit, and writing takes some of the rest)
SPARE_S = 60.0
#: seconds before the limit at which a job that stops there ends its work (`lab.measure.blocks.DEADLINE_MARGIN_S`)
STOP_S = 30.0


class Timed(Protocol):
    seconds: float  # the whole job
    least: float | None  # its shortest useful run (None: it keeps nothing at the limit, and must fit whole)
    again: float  # what a run that goes on from it repeats (an A/B's build and set-up; its profiles are kept)
    step: float  # what a run stopped at the limit keeps whole or not at all (an A/B's block); 0: any time counts


def fits_whole(estimate: Timed, left: float) -> bool:
    return estimate.seconds <= left


def starts_in_part(estimate: Timed, left: float) -> bool:
    """Whether a job that does not fit whole in `left` seconds still starts: one that keeps what it did at the limit
    (an A/B's blocks, a calibration's trials), where its shortest useful run fits with `SPARE_S` to spare."""
    return estimate.least is not None and estimate.least + SPARE_S <= left


def first_whole(ids: list[str], estimates: dict[str, Timed], limit: float, last: set[str] = frozenset()) -> list[str]:
    """`ids` with the jobs that fit `limit` whole first, each group in the order given: a job that only stops at the
    limit goes on in a later run, its set-up again, and where it goes first it takes the time of jobs that would have
    ended (two such jobs run to the limit can leave jobs of a few minutes never started). The jobs in `last` (those
    past their design's most) go after all the others,
    whatever they take: their time is better given to cells that can decide."""
    return sorted(ids, key=lambda i: (i in last, not fits_whole(estimates[i], limit)))


@dataclass(frozen=True)
class Start:
    job: str
    how: str  # "whole", "part" (stops its blocks or trials at the limit) or "not" (does not start in this run)
    worker: int  # 0-based; -1 where it does not start
    at: float  # seconds into the run where it starts


def one_run(ids: list[str], estimates: dict[str, Timed], limit: float, workers: int = 1,
            seconds: dict[str, float] | None = None, least: dict[str, float] | None = None) -> list[Start]:
    """What one run of `limit` seconds on `workers` workers starts, in the order of `ids`: each job on the worker free
    first, if its estimate (or what is left of it, `seconds`) fits what is left of the run, or if its shortest useful
    run (or `least`'s, for a job going on) does, when it stops at the limit and that worker is done. As `lab campaign
    run` starts them, if each job took its estimate."""
    free = [0.0] * max(1, workers)
    starts = []
    for job in ids:
        k = free.index(min(free))
        left = limit - free[k]
        whole = (seconds or {}).get(job, estimates[job].seconds)
        if whole <= left:
            starts.append(Start(job, "whole", k, free[k]))
            free[k] += whole
        elif (shortest := (least or {}).get(job, estimates[job].least)) is not None and shortest + SPARE_S <= left:
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
    #: jobs that start but get no further in runs of this length: after its build and set-up again, what is left of
    #: a run holds no `step` (a long set-up before long blocks in short runs)
    stuck: list[str] = field(default_factory=list)
    capped: bool = False  # stopped counting at `MAX_RUNS` (an estimate too large to be worth counting)


MAX_RUNS = 10_000


def runs_needed(ids: list[str], estimates: dict[str, Timed], limit: float, workers: int = 1) -> Runs:
    """How many runs of `limit` seconds on `workers` workers the jobs `ids` take, one run after another, each started
    as `lab campaign run --time-limit` starts it (`first_whole`, `one_run`): a job that stops at the limit has done
    what fitted, less `STOP_S`, in whole `step`s (an A/B stops before a block that would end past the limit), and
    goes on in the next run, repeating its `again` (build and set-up). A job that cannot start in a run of this
    length even in part is counted apart (`never`), not run, and so is one that gets no further in one (`stuck`). An
    estimate, as good as the estimates it adds up."""
    left = {i: estimates[i].seconds for i in ids}
    out = Runs(never=[i for i in ids if not (fits_whole(estimates[i], limit) or starts_in_part(estimates[i], limit))])
    for i in out.never:
        del left[i]
    going: dict[str, float] = {}  # the jobs gone on from a limit: their set-up again and one step, to start again
    while left and out.runs < MAX_RUNS:
        out.runs += 1
        order = sorted(left, key=lambda i: (left[i] > limit, ids.index(i)))
        for start in one_run(order, estimates, limit, workers, left, going):
            if start.how == "whole":
                del left[start.job]
            elif start.how == "part":
                done, again = limit - start.at - STOP_S, estimates[start.job].again
                step = getattr(estimates[start.job], "step", 0.0)
                whole_steps = (lambda t: t // step * step) if step > 0 else (lambda t: t)
                # a run going on that would only repeat its set-up, or could not start with a step after it
                if whole_steps(limit - STOP_S - again) <= 0 or step > 0 and again + step + SPARE_S > limit:
                    out.stuck.append(start.job)
                    del left[start.job]
                    continue
                # a first run keeps what it did (its profiles) wherever it stops; a run going on, whole steps only
                gain = whole_steps(done - again) if start.job in going else done - again
                going[start.job] = again + step
                left[start.job] -= gain
                out.stopped += 1
                out.again_s += again
    out.capped = bool(left)
    return out

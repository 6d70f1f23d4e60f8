"""One A/B cell's life, the same for `lab ab` and `lab history`: where its result goes, whether it runs (kept as
it is, going on from the blocks of an earlier run, or afresh), and how its result is written.

The rules: a result that exists is kept unless `--replace`; `--resume` goes on from a sequential run that stopped
undecided when nothing it was measured with has changed (`lab.measure.ab.resume_problems`), and says why not
otherwise; an interrupted `--replace` never overwrites the result it was to replace (its blocks go beside the
traces, `aside`); the result file is written before its page and plot, so a failing plot loses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from lab.base.errors import LabError
from lab.measure import ab
from lab.pages import report
from lab.results import schema, store


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do with one cell: `run` it (going on from `prior` when there is one) or keep what exists; `note`
    says why, for the progress line (or for the error, when the caller cannot keep it)."""

    run: bool
    prior: schema.ABResult | None = None
    note: str = ""


def paths(out: Path, scenario: str, name: str) -> dict[str, Path]:
    """Where a cell's result, page and plot go: `<out>/<scenario>/<name>.{json,md,png}`."""
    return report.ab_paths(out, scenario, name)


def plan(where: dict[str, Path], *, replace: bool, resume: bool = False, identity: dict | None = None,
         config: ab.ABConfig | None = None) -> Plan:
    """Whether the cell whose result goes to `where` runs. `identity` (the keys `ab.IDENTITY` and `environment`)
    and `config` describe the run that would go on from an existing result (`resume`)."""
    found = where["json"]
    if not found.exists():
        if resume:
            return Plan(True, note=f"nothing stored at {found} to go on from: running it afresh")
        return Plan(True)
    if resume:
        try:
            previous = store.read(found)
        except LabError as e:
            problems = [f"the stored result cannot be read ({e})"]
        else:
            problems = ab.resume_problems(previous, identity or {}, config or ab.ABConfig())
        if problems and not replace:
            return Plan(False, note=f"{found} cannot go on: {'; '.join(problems)}. Pass --replace to run it afresh.")
        if problems:
            return Plan(True, note=f"{found} cannot go on ({'; '.join(problems)}): running it afresh (--replace)")
        return Plan(True, previous, note=f"going on from {found}: {len(previous.order or [])} block(s) so far, "
                                         f"{previous.verdict_text} ({previous.stopped})")
    if not replace:
        return Plan(False, note=f"{found} already exists: pass --replace to overwrite it, --resume to go on from it, "
                                "or --name to write another.")
    return Plan(True)


def continued(prior: schema.ABResult, result: schema.ABResult) -> schema.ABResult:
    """`result`, which went on from `prior`'s blocks, with which run measured which blocks (`segments`), and the
    profiles of `prior` when this run took none (a run that goes on keeps them, or `--no-profile`)."""
    if not result.timed:  # nothing timed yet: the profiles are still the prior's, where this run took none
        return schema.replace(result, profile=result.profile if result.profile is not None else prior.profile)
    runs, warnings = ab.segments(prior, result)
    return schema.replace(result, segments=runs, warnings=warnings + result.warnings,
                          profile=result.profile if result.profile is not None else prior.profile)


def aside(path: Path, trace_dir: str | Path) -> Path:
    """Where an interrupted run writes when a result is already at `path`: a `--replace` cut short keeps the result
    it was to replace, and this run's part goes to `<trace-dir>/interrupted/<scenario>/` instead."""
    return Path(trace_dir) / "interrupted" / path.parent.name / path.name


def write(result: schema.ABResult, where: dict[str, Path], trace_dir: str | Path, *, went_on: bool,
          progress: Callable[[str], None]) -> dict[str, Path]:
    """Write the result, its page and its plot; returns where they went. An interrupted run that did not go on from
    the result at `where` leaves that result alone (a run that went on holds all its blocks and more: it takes
    its place)."""
    if result.interrupted and where["json"].exists() and not went_on:
        kept = where["json"]
        where = {kind: aside(path, trace_dir) for kind, path in where.items()}
        blocks = result.stats.n if result.stats else 0
        progress(f"interrupted: {kept} is kept; this run's {blocks} block(s) are in {where['json']}")
    report.write_ab(result, where, replace=True)
    return where

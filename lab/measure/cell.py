"""One A/B cell's life, the same for `lab ab` and `lab history`: where its result goes, whether it runs (kept as
it is, going on from the blocks of an earlier run, or afresh), and how its result is written.

The rules: a result that exists is kept unless `--replace`; `--resume` goes on from a sequential run that stopped
undecided when nothing it was measured with has changed (`resume_problems`), and says why not otherwise, and the
result that went on says which run measured which blocks (`segments`); an interrupted `--replace` never overwrites
the result it was to replace (its blocks go beside the traces, `aside`); the result file is written before its page
and plot, so a failing plot loses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from lab.base import naming
from lab.base.errors import LabError
from lab.measure.config import ABConfig
from lab.pages import report
from lab.results import schema, store
from lab.results.schema import ABResult, Segment
from lab.results.states import RESUMABLE
from lab.verdicts import stats


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do with one cell: `run` it (going on from `prior` when there is one) or keep what exists; `note`
    says why, for the progress line (or for the error, when the caller cannot keep it)."""

    run: bool
    prior: schema.ABResult | None = None
    note: str = ""


def paths(out: Path, scenario: str, name: str) -> dict[str, Path]:
    """Where a cell's result, page and plot go: `<out>/<scenario>/<name>.{json,md,png}`."""
    return naming.ab_paths(out, scenario, name)


def plan(where: dict[str, Path], *, replace: bool, resume: bool = False, identity: dict | None = None,
         config: ABConfig | None = None) -> Plan:
    """Whether the cell whose result goes to `where` runs. `identity` (the keys `IDENTITY` and `environment`)
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
            problems = resume_problems(previous, identity or {}, config or ABConfig())
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
    runs, warnings = segments(prior, result)
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
    # which runs were on hosts of another size (each run's CPUs, where recorded), and how many campaign jobs each
    # host was measuring at once (`host_jobs`, where recorded; a run from before it was recorded says so rather
    # than read as one alone): a control call's time moves with the host and with the campaigns beside it
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

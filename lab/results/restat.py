"""`lab table --restat`: decide every committed result again, from the blocks it stores, with the current rule.

The measurement (samples, profiles, verification) is never touched; what is derived from it (`stats`, `verdict`,
`summary`, the verdict's `warnings`, `order_effect`) is replaced, the run's other warnings kept (`warnings_again`),
and a result written under an older rule keeps what that rule said in `previous_verdict`, so the tables can say which
verdicts changed and why.

Format history of the result files (`lab.results.FORMAT_VERSION`):
- 1: signed-rank p for faster/slower, TOST p for equivalence, a bootstrap CI of the median ratio beside them.
- 2: one Hodges-Lehmann interval per verdict, fixed or sequential design (`lab.verdicts.stats`).
- 3: the verdict stored as a value of `lab.verdicts.verdict.Verdict` (`lab.results.schema`); a format-2 file is read
  as format 3 and written so here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from lab.base import files
from lab.base.errors import LabError, UsageError
from lab.results import schema, store
from lab.verdicts import stats
from lab.verdicts.bound import TraceBound, trace_bound
from lab.verdicts.judge import judge

OLD_RULE = ("format 1: faster/slower by the signed-rank p, equivalence by TOST p, shown with a bootstrap CI of the "
            "median ratio that the decision did not use")

#: the beginnings of the warnings a run adds before its verdict's (`lab.measure.cell.continued`: a run that went on
#: from another's blocks; `lab.measure.ab.run`: outputs that differ as the fix means them to, or within a tolerance);
#: after the verdict's come the compiler log's notes (`compilation.notes`, those not a finding)
RUN_WARNINGS = ("the control arm's median moved between the runs", "the outputs differ by up to")


def _design(outcome: Any, config: schema.Timing, n: int) -> stats.Design:
    design = getattr(outcome, "design", None) or (outcome.stats.design if outcome.stats else None)
    if design:
        return stats.Design.from_dict(design)
    return stats.fixed_design(n, config.alpha)  # every format-1 result (and every older sweep point) was a fixed design


def redecide(outcome: schema.ABResult | schema.SweepPoint, config: schema.Timing, fixes: list[str]) -> dict[str, Any] | None:
    """The verdict fields of one A/B outcome (an `ab` result or a sweep point) decided again from its samples;
    None when it has no blocks to decide from (outputs differ, a failed point), unless no fix of it ran, which
    settles it without a block."""
    exercised = outcome.verify.exercised if outcome.verify else {}
    not_run = [name for name, k in exercised.items() if k == 0]
    # no block, but no fix's code ran either: that settles it (`judge`), blocks or not
    unrun = bool(exercised) and bool(fixes) and len(not_run) == len(fixes) and outcome.samples is not None
    bound = trace_bound_of(getattr(outcome, "bound", None), config.margin)
    if not outcome.timed and not unrun and not (bound is not None and bound.decided):
        return None
    samples = (msgspec.to_builtins(outcome.samples) if outcome.samples is not None else
               {arm: {"wall_ms": [], "raw_wall_ms": []} for arm in ("control", "test")})
    n = len(samples["control"]["wall_ms"])
    return judge(samples, getattr(outcome, "order", None) or [],
                 design=_design(outcome, config, n), margin=config.margin, not_run=not_run,
                 fixes=fixes if exercised else [], stopped=getattr(outcome, "stopped", None) or "blocks done",
                 block_s=getattr(outcome, "block_s", None) or [], bound=bound)


def trace_bound_of(stored: schema.Bound | None, margin: float) -> TraceBound | None:
    """The trace's bound read again by the current rule from what a result stores of it (its unprofiled calls and
    its profiled busy times); None where the result has none."""
    if stored is None or not stored.walls_ms or not stored.busy_ms:
        return None
    return trace_bound(stored.walls_ms.get("control", []), stored.walls_ms.get("test", []),
                       stored.busy_ms.get("control", []), stored.busy_ms.get("test", []), margin)


def _apply(outcome: schema.ABResult | schema.SweepPoint, config: schema.Timing, fixes: list[str],
           upgrading: bool = False) -> dict | None:
    new = redecide(outcome, config, fixes)
    if new is None:
        return None
    # what the verdict said before: a format-1 result's own words (its previous_verdict), else the current ones
    before = outcome.previous_verdict["verdict"] if upgrading and outcome.previous_verdict else outcome.verdict_text
    stored = getattr(outcome, "bound", None)
    again = trace_bound_of(stored, config.margin)
    if again is not None:  # the bound read again from what it was read from, by the current rule
        outcome.bound = msgspec.convert({**again.to_dict(), "walls_ms": stored.walls_ms, "busy_ms": stored.busy_ms},
                                        schema.Bound)
    outcome.stats = msgspec.convert(new["stats"], schema.Stats) if new.get("stats") else None
    outcome.verdict, outcome.summary = new["verdict"], new["summary"]
    outcome.warnings, outcome.order_effect = warnings_again(outcome, new["warnings"]), new.get("order_effect")
    return {"from": before, "to": outcome.verdict_text}


def warnings_again(outcome: schema.ABResult | schema.SweepPoint, judged: list[str]) -> list[str]:
    """The warnings of an outcome decided again: the verdict's (`judged`, replacing those it had) between those of
    the run that the verdict does not make, kept: keeping only the verdict's would drop what the run itself warned of
    (blocks gone on from another run's, outputs that differ as meant, graph breaks and recompiles)."""
    compiled = getattr(outcome, "compilation", None) or {}
    notes = {n for n in compiled.get("notes") or [] if not n.startswith("finding:")}
    return ([w for w in outcome.warnings if w.startswith(RUN_WARNINGS)] + judged
            + [w for w in outcome.warnings if w in notes and w not in judged])


def _old_outcomes(data: dict) -> list[dict]:
    return [data] if data["kind"] == "ab" else data["points"]


def _from_format_1(data: dict) -> None:
    """A format-1 result as format 2 (in place): what the old rule said goes to `previous_verdict`, and its
    statistics, which the current rule replaces, are dropped."""
    for outcome in _old_outcomes(data):
        old = outcome.pop("stats", None) or {}
        if outcome.get("samples") and "previous_verdict" not in outcome:
            outcome["previous_verdict"] = {"verdict": outcome.get("verdict"), "summary": outcome.get("summary"),
                                           "rule": OLD_RULE, "ratio_ci": old.get("ratio_ci"),
                                           "p": old.get("p_wilcoxon")}
    data["format"] = 2


def _read(path: Path) -> tuple[dict, schema.Result, bool] | None:
    """A file to decide again: its JSON (a format-1 file upgraded to format 2 in place), its typed result, and
    whether it was format 1; None for kinds `--restat` leaves alone. The measurement is checked
    (`lab.results.check`): a file whose blocks cannot be decided from (a time of zero, more blocks than its design
    allows) is `store.Refused`, by file and field; what is derived from them is what this decides again."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LabError(f"{path}: not a readable result file ({e}).") from e
    if not isinstance(data, dict) or data.get("kind") not in ("ab", "sweep", "hunt", "history"):
        return None
    upgrading = data.get("format") == 1 and data["kind"] in ("ab", "sweep")
    if upgrading:
        _from_format_1(data)
    if data.get("format") not in store.READABLE:
        raise LabError(f"{path}: result format {data.get('format')!r} is unknown to this lab.")
    return data, store.checked(path, store.typed(path, data), derived=False), upgrading


def restat_file(path: Path) -> list[dict]:
    """Re-decide one result file in place; returns the verdict changes it made (one per A/B or sweep point). Hunts
    and histories are rewritten in the current format; other kinds are left alone."""
    found = _read(path)
    if found is None:
        return []
    data, result, upgrading = found
    changes = []
    if isinstance(result, schema.ABResult):
        change = _apply(result, result.config, result.fixes, upgrading)
        if change:
            changes.append({"path": path, "name": result.name, **change})
    elif isinstance(result, schema.SweepResult):
        for point in result.points:
            change = _apply(point, result.config, result.fixes, upgrading)
            if change:
                changes.append({"path": path, "name": f"{result.name} at {result.key} = {point.value}", **change})
    store.write(path, in_its_form(path, result, data), replace=True)
    return changes


def in_its_form(path: Path, result: schema.Result, data: dict) -> dict:
    """`result` as its file had it (`data`): what the schema writes, less the fields the file did not have, where
    reading it back gives them (their defaults). So deciding a file again changes only what it derives from its
    blocks (before, `--restat` wrote every field a newer schema has into 229 committed files). Where leaving them out
    would not read back as `result` (a format-1 file gains its statistics), the whole dump is written."""
    dumped = schema.dump(result)
    kept = _keep_form(dumped, data)
    return kept if schema.dump(store.typed(path, kept)) == dumped else dumped


def _keep_form(new: Any, old: Any) -> Any:
    """`new` with only the keys of `old`, in every dict the two share (lists of the same length item by item)."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {key: _keep_form(value, old[key]) for key, value in new.items() if key in old}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_keep_form(a, b) for a, b in zip(new, old)]
    return new


def restat(results_dir: Path) -> list[dict]:
    """Re-decide every result under `results_dir`; returns every verdict change. Every file is read and checked
    first: one that cannot be decided from is an error naming it (and how many more there are) before any file is
    rewritten, so that a refused file never leaves the results half decided again."""
    paths = files.written(sorted(Path(results_dir).glob("**/*.json")))
    refused = []
    for path in paths:
        try:
            _read(path)
        except LabError as e:
            refused.append(e)
    if refused:
        more = f" ({len(refused) - 1} more file(s) refused as well)" if len(refused) > 1 else ""
        raise UsageError(f"nothing decided again: {refused[0]}{more}")
    changes = []
    for path in paths:
        changes += restat_file(path)
    return changes

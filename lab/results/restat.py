"""`lab table --restat`: decide every committed result again, from the blocks it stores, with the current rule.

The measurement (samples, profiles, verification) is never touched; what is derived from it (`stats`, `verdict`,
`summary`, `warnings`, `order_effect`) is replaced, and a result written under an older rule keeps what that rule
said in `previous_verdict`, so the tables can say which verdicts changed and why.

Format history of the result files (`lab.results.FORMAT_VERSION`):
- 1: signed-rank p for faster/slower, TOST p for equivalence, a bootstrap CI of the median ratio beside them.
- 2: one Hodges-Lehmann interval per verdict, fixed or sequential design (`lab.verdicts.stats`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab import results
from lab.base.errors import LabError
from lab.verdicts import stats
from lab.verdicts.judge import judge

OLD_RULE = ("format 1: faster/slower by the signed-rank p, equivalence by TOST p, shown with a bootstrap CI of the "
            "median ratio that the decision did not use")


def _design(result: dict, n: int) -> stats.Design:
    if result.get("design"):
        return stats.Design.from_dict(result["design"])
    alpha = (result.get("config") or {}).get("alpha", 0.05)
    return stats.fixed_design(n, alpha)  # every format-1 result was a fixed design


def redecide(outcome: dict, config: dict, fixes: list[str]) -> dict[str, Any] | None:
    """The verdict fields of one A/B outcome (an `ab` result or a sweep point) decided again from its samples;
    None when it has no blocks to decide from (outputs differ, a failed point)."""
    samples = outcome.get("samples")
    if not samples or not samples["control"]["wall_ms"]:
        return None
    exercised = (outcome.get("verify") or {}).get("exercised") or {}
    not_run = [name for name, k in exercised.items() if k == 0]
    return judge(samples, outcome.get("order") or [], design=_design(outcome, len(samples["control"]["wall_ms"])),
                 margin=config.get("margin", 0.01), not_run=not_run, fixes=fixes if exercised else [],
                 stopped=outcome.get("stopped", "blocks done"), block_s=outcome.get("block_s") or [])


def _apply(outcome: dict, config: dict, fixes: list[str], upgrading: bool) -> dict | None:
    new = redecide(outcome, config, fixes)
    if new is None:
        return None
    old = {k: outcome.get(k) for k in ("verdict", "summary")}
    old_stats = outcome.get("stats") or {}
    if upgrading and "previous_verdict" not in outcome:
        outcome["previous_verdict"] = {**old, "rule": OLD_RULE,
                                       "ratio_ci": old_stats.get("ratio_ci"), "p": old_stats.get("p_wilcoxon")}
    outcome.update(new)
    return {"from": old["verdict"], "to": new["verdict"]}


def restat_file(path: Path) -> list[dict]:
    """Re-decide one result file in place; returns the verdict changes it made (one per A/B or sweep point)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("kind") not in ("ab", "sweep", "hunt", "calibration"):
        return []
    upgrading = data.get("format") == 1
    if data.get("format") not in (1, results.FORMAT_VERSION):
        raise LabError(f"{path}: result format {data.get('format')!r} is unknown to this lab.")
    changes = []
    if data["kind"] == "ab":
        change = _apply(data, data.get("config") or {}, data["fixes"], upgrading)
        if change:
            changes.append({"path": path, "name": data["name"], **change})
    elif data["kind"] == "sweep":
        for point in data["points"]:
            change = _apply(point, data.get("config") or {}, data["fixes"], upgrading)
            if change:
                changes.append({"path": path, "name": f"{data['name']} at {data['key']} = {point['value']}", **change})
    data["format"] = results.FORMAT_VERSION
    results.write(path, data, replace=True)
    return changes


def restat(results_dir: Path) -> list[dict]:
    """Re-decide every result under `results_dir`; returns every verdict change."""
    changes = []
    for path in sorted(Path(results_dir).glob("**/*.json")):
        changes += restat_file(path)
    return changes

"""From the measured blocks of one A/B to its verdict: the statistics, the warnings and the sentence a page shows.

`lab ab` calls :func:`judge` on the blocks it has just timed, and `lab table --restat` on the blocks a result file
stores, so a committed result is always decided by the same rule as a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lab.base.units import duration
from lab.verdicts import stats
from lab.verdicts.bound import TraceBound
from lab.verdicts.verdict import Verdict


def _calls(samples: dict, arm: str) -> list[float]:
    return [x for block in samples[arm].get("raw_wall_ms") or [] for x in block]


def judge(samples: dict, order: Sequence[Sequence[str]], *, design: stats.Design, margin: float,
          not_run: Sequence[str] = (), fixes: Sequence[str] = (), stopped: str = "blocks done",
          block_s: Sequence[float] = (), bound: TraceBound | None = None) -> dict[str, Any]:
    """The verdict of the blocks in `samples` (each arm's `wall_ms` per block, `raw_wall_ms` per call) under
    `design`, with the trace's `bound` where there is one (`lab.verdicts.bound`: alone it decides "equivalent
    (bounded by the trace)" without blocks; with blocks it cuts their equivalence interval): `stats`, `warnings`,
    `order_effect`, `verdict` (a :class:`Verdict`) and `summary`, ready to go into a result."""
    wall_c, wall_t = samples["control"]["wall_ms"], samples["test"]["wall_ms"]
    unrun = bool(fixes) and len(not_run) == len(fixes)
    never = f"the code of {', '.join(not_run)} never ran in this scenario, so no effect can be attributed to it"
    usable = bound is not None and not bound.reason
    if not wall_c and usable and bound.decided and not unrun:
        return {"verdict": Verdict.BOUNDED, "summary": bound.summary(), "warnings": []}
    if not wall_c:
        why = ("the time limit came before the first block could end" if stopped == "time limit" else
               "interrupted before the first block completed")
        if unrun:  # what the verdict rests on is the check of the outputs, not the blocks (one, where it fits)
            return {"verdict": Verdict.NOT_EXERCISED, "warnings": [], "summary": f"{never} (no block timed: {why})"}
        return {"verdict": Verdict.NO_DATA, "summary": why, "warnings": []}
    comparison = stats.compare(wall_c, wall_t, design=design, margin=margin,
                               raw={arm: _calls(samples, arm) for arm in ("control", "test")},
                               bound=(bound.lo, bound.hi) if usable else None)
    out: dict[str, Any] = {"stats": comparison.to_dict(), "warnings": list(comparison.warnings)}
    if usable and (comparison.ci[1] < bound.lo or comparison.ci[0] > bound.hi):
        out["warnings"].append(
            f"the blocks' interval [{comparison.ci[0]:.4f}, {comparison.ci[1]:.4f}] lies outside what the trace "
            f"allows, [{bound.lo:.4f}, {bound.hi:.4f}]: the bound's premise (a call ends no earlier than its GPU "
            "work) failed here, or the arms' GPU work ran otherwise unprofiled than profiled")
    order_effect = stats.order_effect(wall_c, wall_t, [o[0] == "test" for o in order]) if order else None
    out["order_effect"] = order_effect
    if order_effect is not None and abs(order_effect) > 0.01:
        out["warnings"].append(
            f"order effect: the arm that runs second in a block is {abs(order_effect) * 100:.1f}% "
            f"{'slower' if order_effect > 0 else 'faster'} on average, whichever arm it is; the counterbalanced "
            "order cancels it in the estimate, and mirrored calls (--repeat 2 or more) cancel it inside each block.")
    summary = comparison.summary
    if not comparison.outcome.decided and comparison.outcome is not Verdict.INSUFFICIENT:
        summary += _undecided_note(comparison, design, stopped, block_s)
    if unrun:
        out["verdict"] = Verdict.NOT_EXERCISED
        out["summary"] = f"{never} (timing: {comparison.verdict}: {summary})"
    else:
        out["verdict"] = comparison.outcome
        out["summary"] = summary
        if not_run:
            out["warnings"].append(f"not exercised in this scenario: {', '.join(not_run)}")
    if stopped == "interrupted":
        out["warnings"].append(f"interrupted after {len(wall_c)} of at most {design.max_blocks} blocks")
    return out


def _undecided_note(comparison: stats.Comparison, design: stats.Design, stopped: str, block_s: Sequence[float]) -> str:
    """Why the blocks ended undecided, and about how many would decide."""
    why = {"budget spent": "when the time budget was spent", "max blocks": "at the most blocks allowed",
           "time limit": "before the campaign's time limit", "interrupted": "when interrupted"}.get(stopped, "")
    text = f"; undecided after {comparison.n} blocks" + (f" ({why})" if why else "")
    need = comparison.blocks_to_decide
    if need is None:
        return text
    kind = "a fixed design of" if design.kind == "fixed" else "in all,"
    text += f"; {kind} about {need} blocks would decide it if the estimate held"
    if block_s:
        more = max(0, need - comparison.n) * stats.median(block_s)
        text += f" (about {duration(more)} more at {stats.median(block_s):.1f} s per block)"
    if design.kind == "sequential" and need > design.max_blocks:
        text += f": raise --max-blocks above {need}"
    return text

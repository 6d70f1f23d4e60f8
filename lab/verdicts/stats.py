"""Statistics for A/B timings: the comparison of paired blocks, and the one door to the statistics the lab uses. Pure
functions over plain sequences of numbers (no torch, no IO).

One rule decides every verdict, and the interval it prints is the one it decided on: the Hodges-Lehmann estimate of
the per-block log ratio and the interval that inverts the exact signed-rank test (`lab.verdicts.intervals`), looked
at once (a fixed design) or after every block at a stricter per-look level (a sequential design:
`lab.verdicts.designs`), read as faster, slower or equivalent within a margin (`lab.verdicts.decision`). Around it:
the samples' summaries and ratios (`lab.verdicts.samples`), the warnings about the data (`lab.verdicts.diagnostics`),
the block counts a run needs (`lab.verdicts.planning`) and what calibration reads its trials with
(`lab.verdicts.calibration`). This module holds the record of one comparison (`compare`) and names those modules'
functions, so that a caller writes `stats.median`, `stats.sequential_design` or `stats.compare` alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lab.verdicts.calibration import (NULL_CHECK_P, NullChecks, ProcessSpread, binomial_tail, null_checks,
                                      process_spread)
from lab.verdicts.decision import Decision, blocks_to_decide, decide
from lab.verdicts.designs import SIMULATIONS, Design, crossing_rate, fixed_design, null_paths, sequential_design
from lab.verdicts.diagnostics import (CV_WARN, DRIFT_P, OUTLIER_Z, Modes, bimodal, drift_p, order_effect, outliers,
                                      stability_warnings)
from lab.verdicts.intervals import (Interval, critical_rank, first_decidable, hodges_lehmann, mann_whitney_p,
                                    signed_rank_cdf, signed_rank_p, walsh_averages)
from lab.verdicts.planning import blocks_to_find_equivalent, budget_too_short, call_spread
from lab.verdicts.samples import cv, log_ratios, mad, median, paired_ratios
from lab.verdicts.verdict import Verdict

__all__ = ["CV_WARN", "DRIFT_P", "NULL_CHECK_P", "OUTLIER_Z", "SIMULATIONS", "Comparison", "Decision", "Design",
           "Interval", "Modes", "NullChecks", "ProcessSpread", "Verdict", "bimodal", "binomial_tail",
           "blocks_to_decide", "blocks_to_find_equivalent", "budget_too_short", "call_spread", "compare",
           "critical_rank", "crossing_rate", "cv", "decide", "drift_p", "first_decidable", "fixed_design",
           "hodges_lehmann", "log_ratios", "mad", "mann_whitney_p", "median", "median_metrics", "null_checks",
           "null_paths", "order_effect", "outliers", "paired_ratios", "process_spread", "sequential_design",
           "signed_rank_cdf", "signed_rank_p", "stability_warnings", "walsh_averages"]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The statistics of one paired A/B comparison (times in any one unit; ratios test/control)."""

    n: int
    control_median: float
    test_median: float
    ratio: float  # exp of the Hodges-Lehmann estimate of the log ratio
    ci: tuple[float, float]  # the faster/slower interval, at the design's level
    ci_equivalence: tuple[float, float]  # the equivalence interval
    level: str
    level_equivalence: str
    design: dict
    alpha: float
    margin: float
    direction: str | None
    equivalent: bool
    bounded: bool  # equivalent only with the trace's bound (`ci_bounded`), not by `ci_equivalence` alone
    ci_bounded: tuple[float, float] | None  # the equivalence interval cut by the trace's bound, where there is one
    verdict: str
    summary: str
    blocks_to_decide: int | None
    p_signed_rank: float | None  # fixed designs only: a sequential design has no single-look p
    p_mann_whitney: float
    warnings: tuple[str, ...]
    outcome: Verdict  # `verdict` as a value; a result stores it as its own `verdict`, not in `stats`

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        del out["outcome"]
        return out


def compare(control: Sequence[float], test: Sequence[float], *, design: Design | None = None, alpha: float = 0.05,
            margin: float = 0.01, raw: dict[str, Sequence[float]] | None = None,
            bound: tuple[float, float] | None = None) -> Comparison:
    """Compare paired per-block times under `design` (default: a fixed design over all the blocks); with `bound`,
    the test/control ratios a trace allows (`lab.verdicts.bound`), which cut the equivalence interval."""
    d = log_ratios(control, test)
    design = design or fixed_design(len(d), alpha)
    decision = decide(d, design, margin, bound)
    warnings = stability_warnings(control, test, raw)
    p_u = mann_whitney_p(control, test)
    p_w = signed_rank_p(d) if design.kind == "fixed" else None
    if decision.direction and p_u >= design.alpha:
        warnings.append(f"Mann-Whitney U (unpaired) does not confirm it: p = {p_u:.2g}; the effect relies on the "
                        "pairing of the blocks.")
    return Comparison(
        n=len(d), control_median=median(control), test_median=median(test), ratio=decision.ratio, ci=decision.ci,
        ci_equivalence=decision.ci_eq, level=design.level(), level_equivalence=design.level(equivalence=True),
        design=design.to_dict(), alpha=design.alpha, margin=margin, direction=decision.direction,
        equivalent=decision.equivalent, bounded=decision.bounded,
        ci_bounded=decision.ci_bounded if bound is not None else None, verdict=decision.verdict,
        summary=decision.summary(),
        blocks_to_decide=blocks_to_decide(decision), p_signed_rank=p_w, p_mann_whitney=p_u, warnings=tuple(warnings),
        outcome=decision.outcome)


def median_metrics(pairs: Sequence[dict[str, dict]]) -> dict[str, dict]:
    """Merge the `{metric: {"control", "test", "delta"}}` dicts of several profiled pairs into one: each arm's median
    (None where no pair has the value), the delta of the medians, and each arm's `[min, max]` when pairs differ."""
    out: dict[str, dict] = {}
    for key in pairs[0]:
        merged: dict = {}
        for arm in ("control", "test"):
            values = [p[key][arm] for p in pairs if p.get(key, {}).get(arm) is not None]
            merged[arm] = median(values) if values else None
            if len(values) > 1 and min(values) != max(values):
                merged[f"{arm}_range"] = [min(values), max(values)]
        c, t = merged["control"], merged["test"]
        merged["delta"] = t - c if c is not None and t is not None else None
        out[key] = merged
    return out

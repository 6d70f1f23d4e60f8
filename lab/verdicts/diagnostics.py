"""What makes a verdict less trustworthy, each warned of with a remedy: a wide spread, outliers, bimodal call times,
drift across blocks; and the order effect (how much slower a block's second call is than its first).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from lab.verdicts.samples import cv, mad, median, paired_ratios

CV_WARN = 0.10  # coefficient of variation (std / median) that earns a warning
OUTLIER_Z = 5.0  # modified z-score (|x - median| / (1.4826 MAD)) beyond which a value is an outlier
DRIFT_P = 0.01  # Spearman p-value below which timings drift across blocks


def outliers(values: Sequence[float], z: float = OUTLIER_Z) -> list[int]:
    """Indices of values whose modified z-score exceeds `z`."""
    v = np.asarray(values, dtype=float)
    spread = 1.4826 * mad(v)
    if spread == 0:
        return []
    return [int(i) for i in np.flatnonzero(np.abs(v - np.median(v)) / spread > z)]


def drift_p(values: Sequence[float]) -> float:
    """Spearman p-value of the trend of `values` against their order (small: the values drift)."""
    if len(values) < 5 or len(set(values)) < 2:
        return 1.0
    return float(sps.spearmanr(np.arange(len(values)), values).pvalue)


@dataclasses.dataclass(frozen=True)
class Modes:
    """Two clusters in one arm's call times: `low` and `high` are their medians."""

    low: float
    n_low: int
    high: float
    n_high: int

    @property
    def jump(self) -> float:
        return self.high / self.low - 1


def bimodal(values: Sequence[float], min_share: float = 0.15, min_jump: float = 0.02,
            separation: float = 4.0) -> Modes | None:
    """Two clusters of call times, or None: at least 12 values split at their largest gap into two groups that each
    hold at least `min_share` of them (and 3), the gap is at least `separation` times the spread inside the groups
    (1.4826 MAD) and the upper group's median is at least `min_jump` above the lower's."""
    v = np.sort(np.asarray(values, dtype=float))
    n = len(v)
    k_min = max(3, math.ceil(min_share * n))
    if n < max(12, 2 * k_min):  # fewer calls cannot tell two states from chance
        return None
    gaps = np.diff(v)
    candidates = range(k_min - 1, n - k_min)  # split after index i: groups v[:i+1], v[i+1:]
    i = max(candidates, key=lambda j: gaps[j])
    low, high = v[:i + 1], v[i + 1:]
    spread = 1.4826 * max(mad(low), mad(high), 1e-12 * float(np.median(v)))
    lo_med, hi_med = float(np.median(low)), float(np.median(high))
    if gaps[i] < separation * spread or hi_med / lo_med - 1 < min_jump:
        return None
    return Modes(lo_med, len(low), hi_med, len(high))


def stability_warnings(control: Sequence[float], test: Sequence[float],
                       raw: dict[str, Sequence[float]] | None = None) -> list[str]:
    """Warnings, each with a remedy, for data that make a verdict less trustworthy. `control` and `test` are the
    per-block values; `raw` each arm's individual call times (bimodality shows best there)."""
    out = []
    for arm, values in (("control", control), ("test", test)):
        c = cv(values)
        if c >= CV_WARN:
            out.append(f"{arm}: the standard deviation is {c * 100:.0f}% of the median. Stop other work on the "
                       "machine, or let the sequential design run more blocks (--max-blocks, --budget).")
        bad = outliers(values)
        if bad:
            out.append(f"{arm}: {len(bad)} outlier(s) in blocks {bad}. Check for background load; the rank-based "
                       "interval limits their weight, but rerun if there are many.")
    for arm, values in (raw or {}).items():
        modes = bimodal(values)
        if modes:
            out.append(
                f"{arm}: the call times are bimodal: {modes.n_low} calls near {modes.low:,.1f} ms and {modes.n_high} "
                f"near {modes.high:,.1f} ms ({modes.jump:.0%} apart). Something switches state between calls (GPU "
                "clocks or power capping, another process, memory pressure): check `nvidia-smi -q -d "
                "PERFORMANCE` for throttle reasons, stop other work, and rerun; the interval stays valid but wide.")
    p = drift_p([t / c for c, t in zip(control, test)]) if len(control) == len(test) else 1.0
    if p < DRIFT_P:
        out.append(f"the test/control ratio drifts across blocks (Spearman p = {p:.2g}): the arms do not stay "
                   "comparable. Warm up longer (--warmup, --lead-in) or check for memory growth or clock changes.")
    p = drift_p(list(control))
    if p < DRIFT_P:
        out.append(f"control times drift across blocks (Spearman p = {p:.2g}); interleaving keeps the comparison "
                   "fair, but more warm-up helps.")
    return out


def order_effect(control: Sequence[float], test: Sequence[float], test_first: Sequence[bool]) -> float | None:
    """How much slower the second call of a block is than the first, as a fraction (None without both orders).

    With the ratio r = test/control per block, blocks where test ran first have r ~ e / (1 + o) and those where it
    ran second r ~ e (1 + o), for a true effect e and an order effect o; so (1 + o)**2 ~ median(r | test second) /
    median(r | test first).
    """
    ratios = paired_ratios(control, test)
    first = [r for r, f in zip(ratios, test_first) if f]
    second = [r for r, f in zip(ratios, test_first) if not f]
    if not first or not second:
        return None
    return math.sqrt(median(second) / median(first)) - 1

"""The signed-rank statistic and the Hodges-Lehmann interval it inverts: pure functions over the per-block log
ratios.

- the effect is the Hodges-Lehmann estimate of d: the median of the Walsh averages (d_i + d_j) / 2, i <= j, shown
  as the ratio exp(estimate);
- its interval is the set of shifts that the Wilcoxon signed-rank test does not reject, read off the sorted Walsh
  averages at the ranks of the test's exact null distribution. "The interval excludes 1" and "the test rejects"
  are one statement.

The Mann-Whitney p, which ignores the pairing, is here too: a cross-check of a paired decision.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps


@functools.cache
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    p = np.zeros(n * (n + 1) // 2 + 1)
    p[0] = 1.0
    for k in range(1, n + 1):  # the law of T+ = sum of the ranks k whose sign is positive, each with probability 1/2
        top = k * (k + 1) // 2 + 1  # T+ of the first k ranks is at most k(k+1)/2: the rest is still 0
        p[k:top] += p[:top - k].copy()  # p(s) + p(s - k), in place (results with thousands of pairs ask it)
        p[:top] *= 0.5
    return tuple(np.cumsum(p))


def signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= s) for s = 0 .. n(n+1)/2 under no effect: the exact null law of the signed-rank statistic."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return np.asarray(_signed_rank_cdf(n))


@functools.cache
def critical_rank(n: int, alpha: float) -> int:
    """The rank `a` of the (1 - alpha) interval [W_(a), W_(M+1-a)] of the sorted Walsh averages (M = n(n+1)/2):
    the largest `a` with P(T+ <= a - 1) <= alpha / 2. 0 when n pairs can give no finite interval at this level.
    Kept per (n, alpha): a sequential run and a calibration ask it at every look."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return int(np.searchsorted(signed_rank_cdf(n), alpha / 2 * (1 + 1e-12), side="right"))


def first_decidable(alpha: float) -> int:
    """Fewest pairs whose (1 - alpha) interval can be finite (6 at alpha 0.05: 2 / 2**6 < 0.05)."""
    n = 1
    while critical_rank(n, alpha) < 1:
        n += 1
    return n



@functools.cache
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n)


def walsh_averages(d: Sequence[float]) -> np.ndarray:
    """(d_i + d_j) / 2 for i <= j, sorted."""
    v = np.asarray(d, dtype=float)
    # the index pairs are kept for the block counts a sequential run looks at, not for results of thousands of pairs
    i, j = _pairs(len(v)) if len(v) <= 256 else np.triu_indices(len(v))
    return np.sort((v[i] + v[j]) / 2)


def _sorted_median(w: np.ndarray) -> float:
    """The median of an ascending array, as `np.median` gives it (the mean of the middle two when even)."""
    m = len(w) // 2
    return float(w[m]) if len(w) % 2 else float((w[m - 1] + w[m]) / 2)


@dataclasses.dataclass(frozen=True)
class Interval:
    """The Hodges-Lehmann estimate of a shift and its (1 - alpha) interval (infinite ends: no finite interval)."""

    estimate: float
    lo: float
    hi: float
    alpha: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


def hodges_lehmann(d: Sequence[float], alpha: float) -> Interval:
    """The Hodges-Lehmann estimate of the centre of `d` and the (1 - alpha) interval that inverts the exact
    signed-rank test: a shift lies inside exactly when the test on d - shift does not reject at alpha."""
    if len(d) == 0:
        raise ValueError("no values")
    w = walsh_averages(d)
    a = critical_rank(len(d), alpha)
    estimate = _sorted_median(w)
    if a < 1:
        return Interval(estimate, -math.inf, math.inf, alpha)
    return Interval(estimate, float(w[a - 1]), float(w[len(w) - a]), alpha)


def signed_rank_p(d: Sequence[float]) -> float:
    """Two-sided exact signed-rank p of the hypothesis "no shift", from the same null law as the interval (T+ =
    the number of positive Walsh averages; zero differences count as half)."""
    n = len(d)
    if n == 0:
        return 1.0
    w = walsh_averages(d)
    t = int(np.sum(w > 0)) + int(np.sum(w == 0)) // 2
    cdf = signed_rank_cdf(n)
    low = cdf[t]
    high = 1.0 - (cdf[t - 1] if t >= 1 else 0.0)
    return float(min(1.0, 2 * min(low, high)))


def mann_whitney_p(control: Sequence[float], test: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p of the two unpaired samples: a cross-check that ignores the pairing."""
    if len(control) == 0 or len(test) == 0:
        return 1.0
    # exact distribution for small samples without ties (scipy's "auto" switches to the normal approximation at 8)
    pooled = list(control) + list(test)
    method = "exact" if len(pooled) <= 60 and len(set(pooled)) == len(pooled) else "asymptotic"
    return float(sps.mannwhitneyu(test, control, alternative="two-sided", method=method).pvalue)

"""Statistics for A/B timings: pure functions over plain sequences of numbers (no torch, no IO).

The design is paired: each block runs both arms, so the unit of evidence is the per-block ratio test/control.
Significance comes from the Wilcoxon signed-rank test on the paired differences (exact for small samples), with
Mann-Whitney U on the two unpaired samples as a cross-check; the effect size is the median ratio with a
percentile-bootstrap confidence interval; equivalence is two one-sided signed-rank tests on the log ratios (TOST).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

CV_WARN = 0.10  # coefficient of variation (std / median) that earns a warning
OUTLIER_Z = 5.0  # modified z-score (|x - median| / (1.4826 MAD)) beyond which a value is an outlier
DRIFT_P = 0.01  # Spearman p-value below which timings drift across blocks


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation (unscaled)."""
    v = np.asarray(values, dtype=float)
    return float(np.median(np.abs(v - np.median(v))))


def cv(values: Sequence[float]) -> float:
    """Standard deviation over median (robust centre, as in pyperf's check)."""
    v = np.asarray(values, dtype=float)
    return float(np.std(v, ddof=1) / np.median(v)) if len(v) > 1 else 0.0


def paired_ratios(control: Sequence[float], test: Sequence[float]) -> list[float]:
    """Per-block ratio test/control. Raises ValueError for unequal lengths or non-positive times."""
    if len(control) != len(test):
        raise ValueError(f"paired samples need equal lengths (control {len(control)}, test {len(test)})")
    if any(x <= 0 for x in control) or any(x <= 0 for x in test):
        raise ValueError("times must be > 0")
    return [t / c for c, t in zip(control, test)]


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (seeded: the same samples give the same interval)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        raise ValueError("no values")
    rng = np.random.default_rng(seed)
    medians = np.median(v[rng.integers(0, len(v), size=(n_boot, len(v)))], axis=1)
    lo, hi = np.percentile(medians, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def min_p_signed_rank(n: int) -> float:
    """Smallest two-sided p the exact signed-rank test can give with `n` nonzero pairs: 2 / 2**n."""
    return min(1.0, 2.0 / 2**n) if n > 0 else 1.0


def min_p_mann_whitney(m: int, n: int) -> float:
    """Smallest two-sided p the exact Mann-Whitney U test can give with samples of m and n: 2 / C(m+n, m)."""
    return min(1.0, 2.0 / math.comb(m + n, m)) if m and n else 1.0


def blocks_needed(alpha: float) -> int:
    """Fewest pairs with which the signed-rank test can reach p < alpha at all."""
    n = 1
    while min_p_signed_rank(n) >= alpha:
        n += 1
    return n


def wilcoxon_p(control: Sequence[float], test: Sequence[float], alternative: str = "two-sided") -> float:
    """Wilcoxon signed-rank p on the paired differences test - control (1.0 when every difference is zero)."""
    d = np.asarray(test, dtype=float) - np.asarray(control, dtype=float)
    if not np.any(d):
        return 1.0
    return float(sps.wilcoxon(d, alternative=alternative, zero_method="wilcox").pvalue)


def mann_whitney_p(control: Sequence[float], test: Sequence[float]) -> float:
    if len(control) == 0 or len(test) == 0:
        return 1.0
    # exact distribution for small samples without ties (scipy's "auto" switches to the normal approximation at 8)
    pooled = list(control) + list(test)
    method = "exact" if len(pooled) <= 60 and len(set(pooled)) == len(pooled) else "asymptotic"
    return float(sps.mannwhitneyu(test, control, alternative="two-sided", method=method).pvalue)


def tost_p(ratios: Sequence[float], margin: float) -> float:
    """Two one-sided signed-rank tests that the median ratio lies within (1 - margin, 1 + margin).

    Works on log ratios; returns the larger of the two one-sided p values (small: equivalent).
    """
    r = np.log(np.asarray(ratios, dtype=float))
    lower, upper = math.log(1 - margin), math.log(1 + margin)
    p_low = float(sps.wilcoxon(r - lower, alternative="greater").pvalue) if np.any(r - lower) else 1.0
    p_high = float(sps.wilcoxon(r - upper, alternative="less").pvalue) if np.any(r - upper) else 1.0
    return max(p_low, p_high)


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


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The statistics of one paired A/B comparison (times in any one unit)."""

    n: int
    control_median: float
    test_median: float
    ratio_median: float
    ratio_ci: tuple[float, float]
    p_wilcoxon: float
    p_mann_whitney: float
    p_tost: float
    min_p: float
    alpha: float
    margin: float
    verdict: str
    summary: str
    warnings: tuple[str, ...]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def compare(control: Sequence[float], test: Sequence[float], *, alpha: float = 0.05, margin: float = 0.01,
            level: float = 0.95, seed: int = 0) -> Comparison:
    """Compare paired samples and give a verdict: faster / slower / equivalent within ±margin / no significant
    change / insufficient samples (when the test cannot reach `alpha` with this many pairs)."""
    ratios = paired_ratios(control, test)
    n = len(ratios)
    ci = bootstrap_ci(ratios, level=level, seed=seed)
    ratio = median(ratios)
    p_w = wilcoxon_p(control, test)
    p_u = mann_whitney_p(control, test)
    p_e = tost_p(ratios, margin) if n else 1.0
    min_p = min_p_signed_rank(n)
    warnings = list(stability_warnings(control, test))
    pct = (ratio - 1) * 100
    if min_p >= alpha:
        verdict = "insufficient samples"
        summary = (f"{n} blocks cannot give p < {alpha} with the signed-rank test (smallest possible p = {min_p:.3f}); "
                   f"run at least {blocks_needed(alpha)} blocks")
    elif p_w < alpha:
        verdict = "faster" if ratio < 1 else "slower"
        speed = f"{1 / ratio:.3f}x faster" if ratio < 1 else f"{ratio:.3f}x slower"
        summary = f"{speed} (test/control {ratio:.4f}, 95% CI {ci[0]:.4f}-{ci[1]:.4f}, p = {p_w:.2g})"
        if (p_u < alpha) != (p_w < alpha):
            warnings.append(f"Mann-Whitney U (unpaired) disagrees: p = {p_u:.2g}; the effect relies on the pairing.")
    elif p_e < alpha:
        verdict = f"equivalent within ±{margin * 100:g}%"
        summary = f"test/control {ratio:.4f} ({pct:+.2f}%), 95% CI {ci[0]:.4f}-{ci[1]:.4f}; TOST p = {p_e:.2g}"
    else:
        verdict = "no significant change"
        summary = (f"test/control {ratio:.4f} ({pct:+.2f}%), 95% CI {ci[0]:.4f}-{ci[1]:.4f}, p = {p_w:.2g}; "
                   f"equivalence within ±{margin * 100:g}% not shown (TOST p = {p_e:.2g})")
    return Comparison(n, median(control), median(test), ratio, ci, p_w, p_u, p_e, min_p, alpha, margin, verdict,
                      summary, tuple(warnings))


def stability_warnings(control: Sequence[float], test: Sequence[float]) -> list[str]:
    """Warnings, each with a remedy, for data that make a verdict less trustworthy."""
    out = []
    for arm, values in (("control", control), ("test", test)):
        c = cv(values)
        if c >= CV_WARN:
            out.append(f"{arm}: the standard deviation is {c * 100:.0f}% of the median. Stop other work on the "
                       "machine, add --warmup calls, or run more --blocks.")
        bad = outliers(values)
        if bad:
            out.append(f"{arm}: {len(bad)} outlier(s) in blocks {bad}. Check for background load; the median-based "
                       "statistics limit their weight, but rerun if there are many.")
    p = drift_p([t / c for c, t in zip(control, test)]) if len(control) == len(test) else 1.0
    if p < DRIFT_P:
        out.append(f"the test/control ratio drifts across blocks (Spearman p = {p:.2g}). Warm up longer "
                   "(--warmup) or check for memory growth or clock changes.")
    p = drift_p(list(control))
    if p < DRIFT_P:
        out.append(f"control times drift across blocks (Spearman p = {p:.2g}); interleaving keeps the comparison "
                   "fair, but more warm-up helps.")
    return out


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

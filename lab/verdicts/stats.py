"""Statistics for A/B timings: pure functions over plain sequences of numbers (no torch, no IO).

The design is paired: every block runs both arms, so the unit of evidence is the per-block log ratio
d = log(test / control). One rule decides every verdict, and the interval it prints is the one it decided on:

- the effect is the Hodges-Lehmann estimate of d: the median of the Walsh averages (d_i + d_j) / 2, i <= j, shown
  as the ratio exp(estimate);
- its interval is the set of shifts that the Wilcoxon signed-rank test does not reject, read off the sorted Walsh
  averages at the ranks of the test's exact null distribution. "The interval excludes 1" and "the test rejects"
  are one statement;
- **faster** / **slower**: the (1 - alpha) interval lies below / above 1. **Equivalent within ±m**: the
  (1 - 2 alpha) interval lies inside [1 - m, 1 + m] (two one-sided tests at alpha). Both can hold at once
  ("faster, within ±1%"). Otherwise **undecided**, or **insufficient samples** when so few blocks can give no
  finite interval at all.

A fixed design looks once, after its last block, at level alpha. A sequential design looks after every block from
`min_blocks` to `max_blocks` and stops at the first decision. Looking many times at a fixed-level interval would
decide wrongly far more often than alpha, so each look uses the same interval at a stricter level (a Pocock-type
boundary), chosen so that the chance that any look excludes the true effect is at most alpha. That level comes
from simulating the signed-rank statistic over the looks with no effect: its law depends only on the order of the
values and on their signs, not on how the times are distributed, so the boundary holds for any distribution of
the block ratios that is symmetric around the true effect (the counterbalanced order of the arms makes it so).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from lab.verdicts.verdict import Verdict

CV_WARN = 0.10  # coefficient of variation (std / median) that earns a warning
OUTLIER_Z = 5.0  # modified z-score (|x - median| / (1.4826 MAD)) beyond which a value is an outlier
DRIFT_P = 0.01  # Spearman p-value below which timings drift across blocks
SIMULATIONS = 20_000  # null paths simulated for a sequential boundary (its false-positive rate is then known to ±0.3 %)


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


def log_ratios(control: Sequence[float], test: Sequence[float]) -> list[float]:
    return [math.log(r) for r in paired_ratios(control, test)]


# --- the signed-rank statistic and the Hodges-Lehmann interval ---------------------------------------------------


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


def budget_too_short(budget_s: float, block_s: float, design: Design, done: int = 0) -> str | None:
    """Why a budget of `budget_s` seconds of timing blocks of `block_s` seconds each (after `done` blocks of an earlier
    run) cannot reach the fewest blocks at which `design` can call a change faster or slower, and what budget would;
    None when it can. With fewer than the equivalence interval's fewest, such a run can only end "insufficient
    samples", whatever the change does; with fewer than the faster/slower interval's fewest (one more at the usual
    levels: its per-look alpha is half the equivalence look's), it can find the arms equivalent but never a change,
    however large. The count follows `lab ab`: a block starts only while one more of the median length still fits."""
    needed_eq, needed = first_decidable(design.alpha_look_eq), first_decidable(design.alpha_look)
    blocks = done + max(1, int(budget_s // block_s))
    if blocks >= needed:
        return None
    reach = f"at least {math.ceil((needed - done) * block_s / 60)} min reaches {needed}."
    if blocks >= needed_eq:
        return (f"at {block_s:.0f} s per block, a budget of {budget_s / 60:.3g} min stops after about {blocks} "
                f"block(s): enough to find the arms within the margin, but fewer than the {needed} the rule needs to "
                f"call a change faster or slower (a change of any size would end undecided); {reach}")
    return (f"at {block_s:.0f} s per block, a budget of {budget_s / 60:.3g} min stops after about {blocks} block(s), "
            f"fewer than the {needed_eq} the rule needs to decide anything (it would say insufficient samples) and "
            f"the {needed} it needs to call a change faster or slower; {reach}")


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


# --- designs: when to look, at which level ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Design:
    """When the blocks are looked at and at which level.

    `alpha_look` is the per-look level of the faster/slower interval, `alpha_look_eq` that of the equivalence
    interval (which has 2 alpha in all: alpha per side). A fixed design has one look at alpha and 2 alpha.
    """

    kind: str  # "fixed" | "sequential"
    min_blocks: int
    max_blocks: int
    alpha: float
    alpha_look: float
    alpha_look_eq: float
    simulations: int = 0

    def level(self, equivalence: bool = False) -> str:
        """`95%`, or `95% sequential (99.15% per look)`."""
        overall = 1 - (2 * self.alpha if equivalence else self.alpha)
        if self.kind == "fixed":
            return f"{overall:.0%}"
        per_look = 1 - (self.alpha_look_eq if equivalence else self.alpha_look)
        return f"{overall:.0%} sequential ({per_look:.2%} per look)"

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed design, {self.max_blocks} blocks"
        return (f"sequential: a look after every block from {self.min_blocks} to {self.max_blocks}, each at "
                f"{1 - self.alpha_look:.2%} (faster/slower) and {1 - self.alpha_look_eq:.2%} (equivalence), so "
                f"that all looks together keep alpha {self.alpha:g}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Design":
        return cls(**d)


def fixed_design(blocks: int, alpha: float = 0.05) -> Design:
    return Design("fixed", blocks, blocks, alpha, alpha, 2 * alpha)


def null_paths(max_blocks: int, simulations: int = SIMULATIONS, seed: int = 0) -> np.ndarray:
    """Simulated signed-rank statistics T+ after each of `max_blocks` blocks with no effect: shape
    (simulations, max_blocks), column n-1 holding T+ of the first n blocks.

    With no effect each block's sign is a fair coin independent of its size, and the sizes' ranks are those of
    i.i.d. uniforms: the process is the same for every continuous distribution. Adding block n raises by one the
    rank of every earlier block larger than it, so T+ grows by the earlier positive blocks above it, plus its own
    rank when it is positive.
    """
    rng = np.random.default_rng(seed)
    out = np.empty((simulations, max_blocks), dtype=np.int32)
    chunk = max(1, 4_000_000 // max(1, max_blocks * max_blocks))
    for start in range(0, simulations, chunk):
        m = min(chunk, simulations - start)
        u = rng.random((m, max_blocks))
        positive = rng.random((m, max_blocks)) < 0.5
        t = np.zeros(m, dtype=np.int64)
        for j in range(max_blocks):
            earlier, new = u[:, :j], u[:, j:j + 1]
            t += ((earlier > new) & positive[:, :j]).sum(axis=1)
            t += positive[:, j] * ((earlier < new).sum(axis=1) + 1)
            out[start:start + m, j] = t
    return out


def crossing_rate(paths: np.ndarray, min_blocks: int, alpha_look: float) -> float:
    """The share of null paths whose interval at level `alpha_look` excludes the true effect at some look from
    `min_blocks` on: the sequential design's chance of a wrong decision."""
    crossed = np.zeros(len(paths), dtype=bool)
    for n in range(max(1, min_blocks), paths.shape[1] + 1):
        a = critical_rank(n, alpha_look)
        if a < 1:
            continue
        t = paths[:, n - 1]
        crossed |= (t <= a - 1) | (t >= n * (n + 1) // 2 - a + 1)
    return float(crossed.mean())


def _per_look_alpha(paths: np.ndarray, min_blocks: int, target: float) -> float:
    """The largest per-look level whose crossing rate stays at or below `target` (bisection; the rate is a
    non-decreasing step function of the level)."""
    lo, hi = 1e-7, target
    if crossing_rate(paths, min_blocks, hi) <= target:
        return hi
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if crossing_rate(paths, min_blocks, mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


@functools.cache
def sequential_design(min_blocks: int, max_blocks: int, alpha: float = 0.05, simulations: int = SIMULATIONS,
                      seed: int = 0) -> Design:
    """A look after every block from `min_blocks` to `max_blocks`, each at the per-look levels that keep the chance
    of any wrong decision at `alpha` (faster/slower) and 2 alpha (the equivalence interval, alpha per side)."""
    if min_blocks < 1 or max_blocks < min_blocks:
        raise ValueError(f"need 1 <= min_blocks <= max_blocks (got {min_blocks}, {max_blocks})")
    paths = null_paths(max_blocks, simulations, seed)
    return Design("sequential", min_blocks, max_blocks, alpha, _per_look_alpha(paths, min_blocks, alpha),
                  _per_look_alpha(paths, min_blocks, 2 * alpha), simulations)


# --- the decision -------------------------------------------------------------------------------------------------


def _ratio(x: float) -> float:
    return math.exp(x) if math.isfinite(x) else (math.inf if x > 0 else 0.0)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What one look at the per-block log ratios decides. Intervals are shown as test/control ratios."""

    n: int
    design: Design
    margin: float
    estimate: float  # Hodges-Lehmann estimate of the log ratio
    interval: Interval  # at the design's faster/slower level
    interval_eq: Interval  # at its equivalence level

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def ci(self) -> tuple[float, float]:
        return _ratio(self.interval.lo), _ratio(self.interval.hi)

    @property
    def ci_eq(self) -> tuple[float, float]:
        return _ratio(self.interval_eq.lo), _ratio(self.interval_eq.hi)

    @property
    def direction(self) -> str | None:
        if self.interval.hi < 0:
            return "faster"
        if self.interval.lo > 0:
            return "slower"
        return None

    @property
    def equivalent(self) -> bool:
        lo, hi = self.ci_eq
        return 1 - self.margin <= lo and hi <= 1 + self.margin

    @property
    def decided(self) -> bool:
        return self.direction is not None or self.equivalent

    @property
    def outcome(self) -> Verdict:
        if self.direction:
            return Verdict(self.direction)
        if self.equivalent:
            return Verdict.EQUIVALENT
        if not self.interval.finite and not self.interval_eq.finite:
            return Verdict.INSUFFICIENT
        return Verdict.UNDECIDED

    @property
    def verdict(self) -> str:
        """The verdict in words ("faster, within ±1%"): `outcome` with the equivalence the interval also shows."""
        return self.outcome.text(self.equivalent, self.margin)

    def summary(self) -> str:
        """One sentence: the verdict, the estimate and the interval it was decided on."""
        ci, eq = self.ci, self.ci_eq
        level, level_eq = self.design.level(), self.design.level(equivalence=True)
        band = f"[{1 - self.margin:g}, {1 + self.margin:g}]"
        shown = f"test/control {self.ratio:.4f}, {level} CI {_fmt(ci)}"
        shown_eq = f"{level_eq} CI {_fmt(eq)}"
        if self.direction:
            speed = (f"{1 / self.ratio:.3f}x faster [{_inv(ci[1])}, {_inv(ci[0])}]" if self.direction == "faster"
                     else f"{self.ratio:.3f}x slower [{ci[0]:.3f}, {ci[1]:.3f}]")
            text = f"{speed} ({shown})"
            if self.equivalent:
                text += f", within ±{self.margin * 100:g}% ({shown_eq} inside {band})"
            return text
        if self.equivalent:
            return f"within ±{self.margin * 100:g}%: {shown_eq} inside {band} ({shown})"
        needed = first_decidable(self.design.alpha_look)
        if self.outcome is Verdict.INSUFFICIENT:
            return (f"{self.n} blocks can give no finite interval at alpha {self.design.alpha:g}; at least "
                    f"{first_decidable(self.design.alpha_look_eq)} are needed to decide anything, {needed} to call a "
                    f"change faster or slower")
        if not self.interval.finite and self.n < needed:  # a change of any size: its interval cannot be finite yet
            return (f"test/control {self.ratio:.4f}; {self.n} blocks can give no finite {level} interval for a change "
                    f"(at least {needed} are needed to call one faster or slower), and the {shown_eq} is not inside "
                    f"±{self.margin * 100:g}% {band}")
        return (f"{shown} includes 1, and the {shown_eq} is not inside ±{self.margin * 100:g}% {band}")


def _fmt(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if all(map(math.isfinite, ci)) and ci[0] > 0 else "unbounded"


def _inv(x: float) -> str:
    return f"{1 / x:.3f}" if x > 0 and math.isfinite(x) else "inf"


def decide(d: Sequence[float], design: Design, margin: float) -> Decision:
    """Read the verdict off the intervals of the per-block log ratios `d` at `design`'s per-look levels."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must lie in [0, 1), got {margin}")
    main = hodges_lehmann(d, design.alpha_look)
    eq = hodges_lehmann(d, design.alpha_look_eq)
    return Decision(len(d), design, margin, main.estimate, main, eq)


def blocks_to_decide(decision: Decision) -> int | None:
    """About how many blocks in all the same design would need to decide, if the estimate held and the interval
    narrowed as 1/sqrt(blocks). None when no finite interval exists yet to extrapolate from, or no number would
    (an estimate exactly at the margin)."""
    if decision.decided:
        return decision.n
    main, eq = decision.interval, decision.interval_eq
    if not main.finite or not eq.finite:
        return None
    theta, n, m = decision.estimate, decision.n, math.log1p(decision.margin)
    options = []
    near = (main.hi - theta) if theta < 0 else (theta - main.lo)  # the half-width on the side of 1
    if theta != 0 and near > 0:
        options.append(n * (near / abs(theta)) ** 2)
    half_eq = max(eq.hi - theta, theta - eq.lo)
    if abs(theta) < m and half_eq > 0:
        options.append(n * (half_eq / (m - abs(theta))) ** 2)
    return math.ceil(min(options)) if options else None


def call_spread(blocks: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """How much one arm's calls spread against each other inside its blocks (the raw calls of each block, `repeat`
    of them): the standard deviation of one call's log time, read robustly as 1.4826 MAD of log(call / the block's
    first call) over every later call of every block, over sqrt(2) since each such ratio holds two calls' noise; with
    how many ratios it rests on. Drift from block to block does not enter it, as it cancels in a block's ratio. None
    under 6 ratios."""
    r = [math.log(c / b[0]) for b in blocks if len(b) > 1 and b[0] > 0 for c in b[1:] if c > 0]
    if len(r) < 6:
        return None
    return 1.4826 * mad(r) / math.sqrt(2), len(r)


def blocks_to_find_equivalent(spread: float, repeat: int, margin: float, design: Design) -> int | None:
    """About how many blocks `design` needs to find two arms that differ by nothing within +-`margin`, where one
    call's log time spreads with `spread` (`call_spread`) and a block times `repeat` calls per arm: a block's log ratio
    then spreads with about spread * sqrt(2 / repeat), and the equivalence interval at the per-look level (a
    signed-rank interval, about sqrt(pi / 3) times as wide as a normal one on normal data) narrows as 1/sqrt(blocks)
    until it fits inside log(1 + margin). Never fewer than the fewest at which that interval can be finite. None
    without a margin. On the committed GPU results the block spread this implies came within a factor of 2 of the
    measured one in most (`benchmarks/call_spread.py`): the count is a rough guide, a factor of 4 either way."""
    if margin <= 0 or spread < 0 or repeat < 1:
        return None
    block_sd = spread * math.sqrt(2 / repeat)
    z = float(sps.norm.ppf(1 - design.alpha_look_eq / 2))
    n = (z * math.sqrt(math.pi / 3) * block_sd / math.log1p(margin)) ** 2
    return max(first_decidable(design.alpha_look_eq), math.ceil(n))


# --- calibration ----------------------------------------------------------------------------------------------------


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how often `n` A/A trials would give `k` or more false positives if the
    rule's false-positive rate were exactly `p`."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return float(sps.binom.sf(k - 1, n, p))


NULL_CHECK_P = 0.01  # p below which an A/A check says the blocks break an assumption of the rule


@dataclasses.dataclass(frozen=True)
class NullChecks:
    """What the rule's alpha rests on, tested on the per-block log ratios of A/A trials (both arms the same code).
    The sequential boundary holds for any block distribution that is symmetric around the true effect, with blocks
    independent of each other; an A/A whose blocks break that can give false positives at any rate."""

    blocks: int
    symmetry_p: float  # signed-rank p of the pooled log ratios around 0 (a bias of one arm)
    between_trials_p: float | None  # Kruskal-Wallis p: trials differ in location (something shared within a trial)
    serial_p: float | None  # Spearman p of consecutive blocks within a trial (drift or carry-over)
    serial_rho: float | None = None  # and its correlation: > 0 drift or carry-over, < 0 an alternation

    def broken(self, level: float = NULL_CHECK_P) -> list[str]:
        """The assumptions the blocks reject at `level`, in words. Consecutive blocks that move together (drift,
        carry-over) count; blocks that alternate do not (`alternating`): they make the rule conservative."""
        out = []
        if self.symmetry_p < level:
            out.append(f"symmetry around 1 (p = {self.symmetry_p:.2g}: one arm is favoured)")
        if self.between_trials_p is not None and self.between_trials_p < level:
            out.append(f"trials alike (p = {self.between_trials_p:.2g}: something shared within a trial)")
        if self.serial_p is not None and self.serial_p < level and not self.alternating(level):
            out.append(f"independent consecutive blocks (p = {self.serial_p:.2g})")
        return out

    def alternating(self, level: float = NULL_CHECK_P) -> bool:
        """Consecutive blocks anti-correlated at `level`: an effect that flips from block to block, as an order
        effect does under the counterbalanced order (the arm timed first alternates). It cancels between blocks,
        so the signs of the blocks are less random than the rule assumes: fewer wrong calls, not more."""
        return self.serial_p is not None and self.serial_p < level and (self.serial_rho or 0) < 0


def null_checks(trials: Sequence[Sequence[float]]) -> NullChecks | None:
    """The checks of :class:`NullChecks` on A/A trials, each given as its per-block log ratios. None with fewer
    than 6 blocks in all."""
    trials = [list(t) for t in trials if len(t)]
    pooled = [x for t in trials for x in t]
    if len(pooled) < 6:
        return None
    several = [t for t in trials if len(t) >= 2]
    between = float(sps.kruskal(*several).pvalue) if len(several) >= 2 and len(set(pooled)) > 1 else None
    earlier = [x for t in trials for x in t[:-1]]
    later = [x for t in trials for x in t[1:]]
    serial = sps.spearmanr(earlier, later) if len(earlier) >= 6 else None
    return NullChecks(len(pooled), signed_rank_p(pooled), between, float(serial.pvalue) if serial else None,
                      float(serial.statistic) if serial else None)


@dataclasses.dataclass(frozen=True)
class ProcessSpread:
    """Where the block-to-block spread of a cross-process design comes from: the timed calls grouped by the worker
    process that made them. On the log scale, `within_sd` is the spread of one call around its process's level and
    `between_sd` the spread of the processes' levels themselves (the process effect: memory layout, thread
    placement, what it imported first), the part that no number of calls in one process averages out."""

    processes: int
    calls_per_process: float
    within_sd: float
    between_sd: float

    def block_sd(self, calls: float | None = None) -> float:
        """The spread of a block's log ratio (one process per arm, `calls` timed calls each; default: as measured)."""
        k = calls or self.calls_per_process
        return math.sqrt(2 * self.between_sd ** 2 + 2 * self.within_sd ** 2 / k)

    @property
    def process_share(self) -> float:
        """The share of the block log ratio's variance that the process effect makes."""
        total = self.block_sd() ** 2
        return 2 * self.between_sd ** 2 / total if total else 0.0

    def blocks_for(self, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
        """About how many blocks a fixed two-sided test at `alpha` needs to find a change of `effect` (0.05: 5 %)
        with probability `power`, at this block spread (normal approximation; a sequential rule needs more)."""
        z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
        return math.ceil((z * self.block_sd() / math.log1p(effect)) ** 2)


def process_spread(processes: Sequence[Sequence[float]]) -> ProcessSpread | None:
    """`ProcessSpread` of timed calls grouped by process (each group: one process's calls, in ms), by the one-way
    analysis of variance on their logs (the between-process variance is what the processes' means vary by beyond what
    their own calls explain, floored at 0). None with fewer than 3 processes of 2 calls or more."""
    groups = [np.log(np.asarray(g, dtype=float)) for g in processes if len(g) >= 2 and min(g) > 0]
    if len(groups) < 3:
        return None
    within = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / sum(len(g) - 1 for g in groups))
    k = float(np.mean([len(g) for g in groups]))
    means = np.array([g.mean() for g in groups])
    between = max(0.0, float(means.var(ddof=1)) - within / k)
    return ProcessSpread(len(groups), k, math.sqrt(within), math.sqrt(between))


# --- diagnostics ----------------------------------------------------------------------------------------------------


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


def bimodal(values: Sequence[float], min_share: float = 0.15, min_jump: float = 0.02, separation: float = 4.0) -> Modes | None:
    """Two clusters of call times, or None: at least 12 values split at their largest gap into two groups that each
    hold at least `min_share` of them (and 3), the gap is at least `separation` times the spread inside the groups (1.4826 MAD)
    and the upper group's median is at least `min_jump` above the lower's."""
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


# --- the comparison record ------------------------------------------------------------------------------------------


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
            margin: float = 0.01, raw: dict[str, Sequence[float]] | None = None) -> Comparison:
    """Compare paired per-block times under `design` (default: a fixed design over all the blocks)."""
    d = log_ratios(control, test)
    design = design or fixed_design(len(d), alpha)
    decision = decide(d, design, margin)
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
        equivalent=decision.equivalent, verdict=decision.verdict, summary=decision.summary(),
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

"""What the calibration's trials are read with: the binomial tail of A/A false positives, the checks of what the
rule's alpha rests on (symmetry, trials alike, independent blocks), and where a cross-process design's spread comes
from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from lab.verdicts.intervals import signed_rank_p


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

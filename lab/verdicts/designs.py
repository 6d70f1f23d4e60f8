"""Designs: when the blocks are looked at, and at which level.

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

import numpy as np

from lab.verdicts.intervals import critical_rank

#: null paths simulated for a sequential boundary (its false-positive rate is then known to ±0.3 %)
SIMULATIONS = 20_000


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

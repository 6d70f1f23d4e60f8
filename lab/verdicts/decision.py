"""The decision one look makes: the verdict read off the intervals of the per-block log ratios at a design's
per-look levels, and how many blocks an undecided look would need.

- **faster** / **slower**: the (1 - alpha) interval lies below / above 1. **Equivalent within ±m**: the
  (1 - 2 alpha) interval lies inside [1 - m, 1 + m] (two one-sided tests at alpha). Both can hold at once
  ("faster, within ±1%"). Otherwise **undecided**, or **insufficient samples** when so few blocks can give no
  finite interval at all.
- With the bound a trace puts on the change (`lab.verdicts.bound`), the equivalence interval is the part of it that
  the bound allows: the true ratio lies in both (each at its own error rate), so in their intersection, and a
  sequential design can stop for equivalence as soon as that lies inside the band: **equivalent within ±m (bounded by
  the trace)**. The faster/slower interval is never cut: a bound only ever rules changes out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from lab.verdicts.designs import Design
from lab.verdicts.intervals import Interval, first_decidable, hodges_lehmann
from lab.verdicts.verdict import Verdict


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
    bound: tuple[float, float] | None = None  # the ratios the trace allows (`lab.verdicts.bound.TraceBound`)

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

    def _inside(self, lo: float, hi: float) -> bool:
        return 1 - self.margin <= lo and hi <= 1 + self.margin

    @property
    def equivalent_alone(self) -> bool:
        """Equivalence read off the blocks' interval alone."""
        return self._inside(*self.ci_eq)

    @property
    def ci_bounded(self) -> tuple[float, float]:
        """The equivalence interval cut by the trace's bound (the interval itself without one)."""
        lo, hi = self.ci_eq
        if self.bound is None:
            return lo, hi
        return max(lo, self.bound[0]), min(hi, self.bound[1])

    @property
    def equivalent(self) -> bool:
        return self.equivalent_alone or self._inside(*self.ci_bounded)

    @property
    def bounded(self) -> bool:
        """Equivalent only with the bound: the blocks' interval alone is not inside the band."""
        return self.equivalent and not self.equivalent_alone

    @property
    def decided(self) -> bool:
        return self.direction is not None or self.equivalent

    @property
    def outcome(self) -> Verdict:
        if self.direction:
            return Verdict(self.direction)
        if self.bounded:
            return Verdict.BOUNDED
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
        if self.bounded:
            cut = self.ci_bounded
            return (f"within ±{self.margin * 100:g}% (bounded by the trace): {shown_eq}, cut by the trace's bound "
                    f"[{self.bound[0]:.4f}, {self.bound[1]:.4f}] to {_fmt(cut)}, inside {band} ({shown})")
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


def decide(d: Sequence[float], design: Design, margin: float,
           bound: tuple[float, float] | None = None) -> Decision:
    """Read the verdict off the intervals of the per-block log ratios `d` at `design`'s per-look levels; with `bound`
    (the test/control ratios a trace allows), the equivalence interval is cut by it."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must lie in [0, 1), got {margin}")
    main = hodges_lehmann(d, design.alpha_look)
    eq = hodges_lehmann(d, design.alpha_look_eq)
    return Decision(len(d), design, margin, main.estimate, main, eq, bound)


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

"""The bound a trace puts on an A/B's effect: a call cannot end before its GPU work is done.

Each arm's call takes at least the time its GPU is busy, and the profiled calls measure that busy time on the device
itself: the profiler slows the host, which issues the work, not the kernels and copies, which run the same. So the
ratio of the arms' call times (test/control) lies between

    busy_test / wall_control   and   wall_test / busy_control,

with `wall` an unprofiled call's time. When the whole of that interval lies inside [1 - m, 1 + m], the change is
equivalent within ±m without a timing block: nothing the host does differently can move a call that its GPU keeps
busy. That is where a fix that only removes host stalls lands on a GPU-bound call (every stall it removes was hidden
behind queued work). Where either arm leaves its GPU idle for more than the margin, the bound is wider than the
margin and decides nothing; the blocks then decide, and a sequential design looks at their interval cut by the bound
(:func:`lab.verdicts.decision.decide`), which can only narrow it.

The bound leans to the safe side at each step:
- `busy` is the busiest single stream's device time (`lab.traces.streams`), not the union of all streams: a stream's
  work runs item after item whatever the host does, while how streams overlap depends on when the host issued their
  work;
- it is the least such time over the arm's profiled calls, less the spread between them (the GPU's clocks move a
  kernel's time from call to call) and at least `PROFILED_ALLOWANCE` of it (a profiled call's device work can take
  longer than an unprofiled call's whole time: the profiler records every kernel, and the clocks move between calls),
  so it needs two profiled calls at least;
- `wall` is the slowest of `BOUND_CALLS` unprofiled calls of the arm, timed in alternation with the other arm's: the
  slowest of n calls lies below the median call with probability 2^-n, so each end of the interval fails to hold with
  probability 2^-8 (0.4 %) at most, well under the alpha the blocks decide at.
Pure: no torch, no IO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

#: unprofiled calls per arm the bound is read from (each end holds but with probability 2^-BOUND_CALLS)
BOUND_CALLS = 8
#: profiled calls per arm it needs at least, for the spread of the busy time
PROFILED_CALLS = 2
#: the least share of the busy time the floor takes off: more than a profiled call's device work was seen to exceed
#: an unprofiled call's whole time by (results/bound/, FINDINGS "The trace's bound")
PROFILED_ALLOWANCE = 0.005


@dataclasses.dataclass(frozen=True)
class TraceBound:
    """The interval of test/control call-time ratios that the arms' GPU work allows, and how it was obtained.

    `lo`, `hi`: the ratio's least and most; `reason`: empty where the bound could be read, else why not (then `lo` is
    0 and `hi` infinite, a bound that bounds nothing)."""

    lo: float
    hi: float
    margin: float
    control_wall_ms: float | None = None
    test_wall_ms: float | None = None
    control_busy_ms: float | None = None
    test_busy_ms: float | None = None
    calls: int = 0
    profiled: int = 0
    reason: str = ""

    @property
    def decided(self) -> bool:
        """Whether the bound alone decides equivalence within the margin."""
        return not self.reason and 1 - self.margin <= self.lo and self.hi <= 1 + self.margin

    @property
    def gain(self) -> float:
        """The most the test arm can be faster, as a share of the control's call."""
        return 1 - self.lo

    @property
    def loss(self) -> float:
        """The most the test arm can be slower, as a share of the control's call."""
        return self.hi - 1

    def summary(self) -> str:
        """One sentence: what the bound says and what it rests on."""
        if self.reason:
            return f"no bound from the trace: {self.reason}"
        band = f"±{self.margin * 100:g}%"
        head = (f"equivalent within {band} (bounded by the trace)" if self.decided else
                f"the trace bounds the change to [{self.lo:.4f}, {self.hi:.4f}], wider than {band}")
        return (f"{head}: test/control in [{self.lo:.4f}, {self.hi:.4f}], at most {self.gain * 100:.2f}% faster and "
                f"{self.loss * 100:.2f}% slower; the GPU's busiest stream works {self.control_busy_ms:,.1f} ms "
                f"(control) and {self.test_busy_ms:,.1f} ms (test) of calls that take at most "
                f"{self.control_wall_ms:,.1f} and {self.test_wall_ms:,.1f} ms ({self.calls} unprofiled calls and "
                f"{self.profiled} profiled calls per arm)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TraceBound:
        """The bound of a stored record (`to_dict`, with or without the inputs a result keeps beside it)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def unbounded(margin: float, reason: str) -> TraceBound:
    return TraceBound(lo=0.0, hi=float("inf"), margin=margin, reason=reason)


def busy_floor(busy_ms: Sequence[float]) -> float:
    """The least of an arm's profiled busy times, less their spread and at least `PROFILED_ALLOWANCE` of it: what its
    GPU work takes at the least in an unprofiled call."""
    least = min(busy_ms)
    return max(0.0, least - max(max(busy_ms) - least, PROFILED_ALLOWANCE * least))


def trace_bound(control_walls_ms: Sequence[float], test_walls_ms: Sequence[float],
                control_busy_ms: Sequence[float], test_busy_ms: Sequence[float], margin: float) -> TraceBound:
    """The bound of the arms' GPU work on their call-time ratio (module docstring). `*_walls_ms`: unprofiled calls;
    `*_busy_ms`: the busiest stream's device time in each profiled call."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must lie in [0, 1), got {margin}")
    calls = min(len(control_walls_ms), len(test_walls_ms))
    profiled = min(len(control_busy_ms), len(test_busy_ms))
    if calls < BOUND_CALLS:
        return unbounded(margin, f"{calls} unprofiled call(s) per arm, {BOUND_CALLS} are needed")
    if profiled < PROFILED_CALLS:
        return unbounded(margin, f"{profiled} profiled call(s) per arm, {PROFILED_CALLS} are needed for the spread "
                                 "of the GPU's busy time")
    wall_c, wall_t = max(control_walls_ms), max(test_walls_ms)
    busy_c, busy_t = busy_floor(control_busy_ms), busy_floor(test_busy_ms)
    if min(wall_c, wall_t) <= 0 or min(busy_c, busy_t) <= 0:
        return unbounded(margin, "an arm has no GPU work left once the spread of its busy time is taken off")
    return TraceBound(lo=busy_t / wall_c, hi=wall_t / busy_c, margin=margin, control_wall_ms=wall_c,
                      test_wall_ms=wall_t, control_busy_ms=busy_c, test_busy_ms=busy_t, calls=calls,
                      profiled=profiled)

"""What an A/B measured, as stored: each arm's timings (`Samples`), the statistics its verdict was read off
(`Stats`), a sequential design's looks (`Look`), and what every A/B outcome derives from them (`Measured`)."""

from __future__ import annotations

from typing import Any

import msgspec

from lab.results.header import Strict


class ArmSamples(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One arm's timings: per block (`wall_ms`, `steps_ms`: the median of its timed calls) and per call."""

    wall_ms: list[float] = []
    steps_ms: list[list[float]] = []
    raw_wall_ms: list[list[float]] = []
    raw_steps_ms: list[list[list[float]]] = []


class Samples(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    control: ArmSamples
    test: ArmSamples


class Stats(Strict, kw_only=True):
    """The statistics a verdict was read off (`lab.verdicts.stats.Comparison`)."""

    n: int
    control_median: float
    test_median: float
    ratio: float
    ci: tuple[float, float]
    ci_equivalence: tuple[float, float]
    level: str
    level_equivalence: str
    design: dict[str, Any]
    alpha: float
    margin: float
    direction: str | None = None
    equivalent: bool = False
    bounded: bool = False  # equivalent only with the trace's bound: `ci_bounded`, not `ci_equivalence` alone
    ci_bounded: tuple[float, float] | None = None  # the equivalence interval cut by the trace's bound
    verdict: str = ""  # the statistics' own words, beside the result's typed verdict
    summary: str = ""
    blocks_to_decide: int | None = None
    p_signed_rank: float | None = None
    p_mann_whitney: float | None = None
    warnings: list[str] = []

    @property
    def sequential(self) -> bool:
        return self.design.get("kind") == "sequential"

    def decided_interval(self) -> tuple[tuple[float, float], str]:
        """The interval a verdict was read off, and its level: the equivalence interval for "equivalent within ±m",
        else the faster/slower one (which also holds "faster, within ±m"); for an equivalence the trace's bound
        decided, the equivalence interval cut by the bound."""
        if self.bounded and self.ci_bounded is not None and not self.direction:
            return self.ci_bounded, f"{self.level_equivalence}, cut by the trace's bound"
        if self.equivalent and not self.direction:
            return self.ci_equivalence, self.level_equivalence
        return self.ci, self.level


class Bound(Strict, kw_only=True):
    """The bound the arms' GPU work puts on their call-time ratio (`lab.verdicts.bound.TraceBound`), with what it was
    read from: each arm's unprofiled calls (`walls_ms`) and its busiest stream's device time in each profiled call
    (`busy_ms`), so that `lab table --restat` reads it again by the current rule."""

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
    walls_ms: dict[str, list[float]] = {}
    busy_ms: dict[str, list[float]] = {}

    @property
    def decided(self) -> bool:
        """Whether it alone decides equivalence (`lab.verdicts.bound.TraceBound.decided`, the one rule)."""
        from lab.verdicts.bound import TraceBound

        return TraceBound.from_dict(msgspec.structs.asdict(self)).decided

    @property
    def interval(self) -> tuple[float, float] | None:
        """The ratios it allows, where it could be read."""
        return None if self.reason else (self.lo, self.hi)


class OffloadLimits(Strict, kw_only=True):
    """An offloaded A/B's calls against the limits their copies and compute allow (`lab.verdicts.offload_limit`):
    the compute time without offloading (`compute_ms`, the median of `walls_ms`), the host's copy rates it was read
    at, and each arm's `OffloadLimit` record (`multiple`: its call over the overlap limit); `reason` where it could
    not be read (the weights do not fit without offloading, no profiled copies)."""

    compute_ms: float | None = None
    walls_ms: list[float] = []
    rates: dict[str, float] | None = None
    control: dict[str, float] | None = None
    test: dict[str, float] | None = None
    reason: str = ""


class Look(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One look of a sequential design: the interval after `n` blocks."""

    n: int
    ratio: float
    ci: tuple[float, float]
    ci_equivalence: tuple[float, float]
    verdict: str


class Measured:
    """What every A/B outcome (a whole `lab ab` result, or one point of a sweep) has: `verdict`, `summary`, `stats`,
    `samples`, `verify`, `warnings`, `order_effect`, `interrupted`, `previous_verdict` (what an older rule said,
    `lab table --restat`), and what follows from them."""

    __slots__ = ()

    @property
    def verdict_text(self) -> str:
        """The verdict in words: "faster, within ±1%" where the interval was also inside the margin."""
        if self.stats is None:
            return self.verdict.text()
        return self.verdict.text(self.stats.equivalent, self.stats.margin)

    @property
    def timed(self) -> bool:
        """Whether it has timed blocks."""
        return self.samples is not None and bool(self.samples.control.wall_ms)

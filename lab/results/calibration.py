"""The result of `lab calibrate`: its trials (A/A comparisons and positive controls with a known stall), and what
they add up to (the false-positive rate against alpha, the power against the stall, the effort to decide)."""

from __future__ import annotations

from typing import Any

from lab.results.conditions import Environment
from lab.results.header import ResultHeader, Strict


class CalibrationTrial(Strict, kw_only=True):
    """One comparison of `lab calibrate` (an A/A, or a positive control with a known stall): its verdict in the words
    of the rule that decided it (a format-2 file's fixed design said "no significant change") and what it rests on."""

    trial: int
    verdict: str
    ratio: float
    control_ms: list[float]
    test_ms: list[float]
    direction: str | None = None  # "faster" or "slower" when it called the speed changed
    ci: tuple[float, float] | None = None
    ci_equivalence: tuple[float, float] | None = None
    p: float | None = None  # the fixed design's test (format 2)
    blocks: int | None = None
    seconds: float | None = None
    stopped: str | None = None  # why the sequential rule stopped
    stalls_ran: int | None = None  # the positive control's injected stalls that ran
    first: list[str] = []  # the arm that went first in each block
    calls_ms: dict[str, list[list[float]]] = {}  # every timed call, per arm and block
    run: str | None = None  # which of several runs, each going on from the same first trials, measured it ("b")


class CalibrationTrials(Strict, kw_only=True):
    aa: list[CalibrationTrial] = []
    positive: list[CalibrationTrial] = []


class _Effort(Strict, kw_only=True):
    """What the trials of one kind took: blocks and seconds to decide (median, most) and seconds in all."""

    blocks_median: float | None = None
    blocks_max: int | None = None
    seconds_median: float | None = None
    seconds_max: float | None = None
    seconds_total: float | None = None


class AASummary(_Effort, kw_only=True):
    """The A/A trials: how often identical arms were called faster or slower, against alpha."""

    trials: int
    false_positives: int
    rate: float | None
    rate_ci95: tuple[float, float]
    alpha: float
    sampling_error: float | None
    within_alpha_plus_sampling_error: bool
    verdicts: dict[str, int] = {}


class PositiveSummary(_Effort, kw_only=True):
    """The positive controls: how often a known host stall, removed in the test arm, was called faster."""

    trials: int
    detected: int
    power: float | None
    power_ci95: tuple[float, float]
    stall_ms_per_step: float
    steps: int | None = None
    expected_effect_ms: float | None = None
    median_ratio: float | None = None
    verdicts: dict[str, int] = {}


class CalibrationResult(ResultHeader, kw_only=True):
    """One `lab calibrate`: the false-positive rate of A/A comparisons and the power against a known stall, under
    the design `lab ab` uses (in one process, or across worker processes)."""

    kind: str = "calibration"
    size: str
    layers: int | None = None
    steps: int
    mode: str
    build: str | None = None
    settings: list[str] = []
    config: dict[str, Any]  # `lab.measure.calibrate.CalibrationConfig` as stored (its timing as `Timing` is)
    environment: Environment
    design: dict[str, Any] | None = None  # `lab.verdicts.stats.Design.to_dict()`; format 2's fixed design: none
    block_layout: str | None = None
    processes: str | None = None
    aa: AASummary
    positive: PositiveSummary
    call_ms_median: float | None = None
    interrupted: bool = False
    note: str | None = None
    trials: CalibrationTrials

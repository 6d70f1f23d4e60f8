"""The result of `lab history`: a list of releases, each measured (or kept, or skipped) against one reference
release."""

from __future__ import annotations

from typing import Any

from lab.results.conditions import CompileOptions, Environment, Timing
from lab.results.header import ResultHeader, Strict
from lab.verdicts.verdict import Verdict


class HistoryRow(Strict, kw_only=True):
    """One release of a history: the reference, a measured (or kept) pair, or why none was measured."""

    version: str
    origin: str = ""
    status: str  # "reference", "measured", "kept", "skipped", "failed", "not reached" (a stopped history)
    why: str | None = None
    result: str | None = None
    verdict: Verdict | None = None
    equivalent: bool = False  # the interval was also inside the margin ("faster, within ±1%")
    summary: str | None = None
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    level: str | None = None
    decided_ci: tuple[float, float] | None = None
    decided_level: str | None = None
    blocks: int | None = None
    control_ms: float | None = None
    test_ms: float | None = None
    metrics: dict[str, dict[str, Any]] | None = None
    identical: bool | None = None
    max_abs_diff: float | None = None
    warnings: list[str] = []
    interrupted: bool = False  # a Ctrl-C or a time limit in this pair's blocks: the history stopped after it
    processes: str | None = None  # how the pair's worker processes were paired over its blocks (`ABResult.workers`)

    @property
    def pairing(self) -> str | None:
        """`ABResult.process_design` of this row's pair: a row from before it was recorded was measured with one
        pair of processes (the design before fresh pairs); None for rows without a pair."""
        if self.status not in ("measured", "kept"):
            return None
        return self.processes or "one pair"

    def words(self, margin: float = 0.01) -> str:
        """The verdict in words ("" for the reference and the rows without a pair)."""
        return self.verdict.text(self.equivalent, margin) if self.verdict else ""


class HistoryResult(ResultHeader, kw_only=True):
    """One `lab history`: a list of releases, each against one reference release."""

    kind: str = "history"
    pipeline: str = ""
    size: str
    layers: int | None = None
    call: str | None = None
    steps: int
    mode: str
    compile: CompileOptions | None = None
    reference: dict[str, Any]
    config: Timing
    environment: Environment
    seconds: float | None = None
    releases: list[HistoryRow]
    build: str | None = None
    settings: list[str] = []

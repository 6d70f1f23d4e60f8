"""The A/B results: one `lab ab` run (`ABResult`) and one `lab sweep` (`SweepResult`: an A/B at each value of one
parameter)."""

from __future__ import annotations

from typing import Any, Union

from lab.results.conditions import CompileOptions, Environment, Segment, Timing, Workers
from lab.results.header import ResultHeader, Strict
from lab.results.outcome import Bound, Look, Measured, OffloadLimits, Samples, Stats
from lab.results.states import RESUMABLE
from lab.results.verification import Verify
from lab.verdicts.verdict import Verdict


class ABResult(Measured, ResultHeader, kw_only=True):
    """One `lab ab` run: what ran, where, how it was timed, and what it measured."""

    kind: str = "ab"
    pipeline: str = ""
    size: str
    layers: int | None = None
    steps: int
    mode: str
    compile: CompileOptions | None = None
    isolated: bool = False
    fixes: list[str]
    #: the fixes each arm ran (`control`, `test`), as the run applied them; None in results from before it was recorded
    arms: dict[str, list[str]] | None = None
    control: str = "off"
    base: list[str] = []  # fixes on in both arms (`lab ab --base`): the A/B measures what `fixes` add over them
    notes: list[str] = []
    config: Timing
    environment: Environment
    build: str | None = None
    build_s: float | None = None
    settings: list[str] = []  # the settings users run that were on in both arms (`lab.run.settings`)
    decoded: bool = False  # each call decoded to images or video (`--full-decode`), as a user's does; else latents
    verify: Verify | None = None
    phase_s: dict[str, float] | None = None
    profile: dict[str, Any] | None = None
    samples: Samples | None = None
    order: list[list[str]] | None = None
    interrupted: bool = False
    stopped: str | None = None
    block_s: list[float] | None = None
    looks: list[Look] | None = None
    design: dict[str, Any] | None = None
    step_times: dict[str, list[float | None]] | None = None
    stats: Stats | None = None
    bound: Bound | None = None  # what the trace allows the change to be (`lab.verdicts.bound`)
    offload: OffloadLimits | None = None  # an offloaded call against its copies' and compute's limits
    warnings: list[str] = []
    order_effect: float | None = None
    verdict: Verdict
    summary: str = ""
    compilation: dict[str, Any] | None = None
    previous_verdict: dict[str, Any] | None = None  # what an older rule said (`lab table --restat`)
    diffusers: dict[str, dict[str, Any]] | None = None  # two diffusers side by side: each arm's
    on_diffusers: str | None = None  # both arms on another diffusers than the installed one (`lab ab --diffusers`)
    patches: dict[str, Any] | None = None  # a change given as diffs (`--patch`)
    segments: list[Segment] | None = None
    workers: Workers | None = None  # arms in worker processes: how the processes were paired over the blocks

    @property
    def process_design(self) -> str | None:
        """How the arms' worker processes were paired over the blocks: "fresh pair per block", "one pair" (an
        older result that does not say was measured with one pair: the design before fresh pairs), or None when
        both arms ran in one process."""
        if not self.isolated:
            return None
        return self.workers.design if self.workers is not None else "one pair"

    @property
    def profiles_only(self) -> bool:
        """Whether it stopped (a time limit, a Ctrl-C) in or after its profiles, before its first block: owed by its
        campaign, and gone on from with its profiles (`lab ab --resume`)."""
        return not self.timed and self.stopped in RESUMABLE and self.profile is not None

    @property
    def title(self) -> str:
        """What it compares: its fixes, two diffusers, or A/A."""
        if self.diffusers:
            return f"diffusers {self.diffusers['control']['version']} -> {self.diffusers['test']['version']}"
        tested = " + ".join(self.fixes) or "A/A (same code)"
        return f"{tested} over {' + '.join(self.base)}" if self.base else tested


class SweepPoint(Measured, Strict, kw_only=True):
    """One value of a sweep's parameter: an A/B at that value."""

    value: Union[int, float, str]
    mode: str | None = None
    verdict: Verdict
    summary: str = ""
    stats: Stats | None = None
    metrics: dict[str, Any] | None = None
    samples: Samples | None = None
    verify: Verify | None = None
    warnings: list[str] = []
    order_effect: float | None = None
    interrupted: bool = False
    previous_verdict: dict[str, Any] | None = None
    #: as in `ABResult` (older sweeps lack them: their design is their stats')
    order: list[list[str]] | None = None
    stopped: str | None = None
    block_s: list[float] | None = None
    design: dict[str, Any] | None = None
    bound: Bound | None = None


class SweepResult(ResultHeader, kw_only=True):
    """One `lab sweep`: the A/B at each value of one parameter."""

    kind: str = "sweep"
    size: str
    layers: int | None = None
    fixes: list[str]
    key: str
    values: list[Union[int, float, str]]
    config: Timing
    base_mode: str
    environment: Environment
    points: list[SweepPoint]
    notes: list[str] = []
    build: str | None = None
    settings: list[str] = []

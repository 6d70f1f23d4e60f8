"""The results of profiled calls: a `lab hunt` (every sync site of one call), a `lab census` (one pipeline's calls
without fixes and with each), and a `lab profile --report` (where the host time of one call goes). The bulky trace
metrics stay plain dicts, as the trace analysis makes them."""

from __future__ import annotations

from typing import Any

from lab.results.conditions import Environment
from lab.results.header import ResultHeader, Strict


class HuntResult(ResultHeader, kw_only=True):
    """One `lab hunt`: every sync site of one call, from the profiler and from CUDA's sync debug mode."""

    kind: str = "hunt"
    size: str
    layers: int | None = None
    build: str | None = None
    settings: list[str] = []
    steps: int
    mode: str
    fixes: list[str]
    environment: Environment
    what: str
    debug_mode_note: str | None = None
    trace: str
    sites: list[dict[str, Any]]
    per_call: int
    steps_run: int | None = None
    in_loop_per_step: float
    harness_syncs: int
    static_candidates: int
    static_hit: list[Any] = []
    runtime_missed_by_scan: list[Any] = []
    files_scanned: list[str] = []
    #: the device work of the profiled call by kind (`lab.traces.work.summary`) and the GPU-side waste one watched
    #: call found (`lab.measure.waste.watch_call`); None in a hunt made before them
    work: dict[str, Any] | None = None
    waste: dict[str, Any] | None = None
    #: compiled: the compiler's warnings and graph breaks in the compiling warm-up (`lab.measure.waste.compiler_notes`)
    compiler: dict[str, Any] | None = None

    @property
    def in_loop_per_call(self) -> int:
        """Syncs per call inside the denoising loop (the lab's own at the call boundaries left out)."""
        return round(self.in_loop_per_step * (self.steps_run or self.steps))


class CensusArm(Strict, kw_only=True):
    """One profiled call of a census pipeline with one fix set (none: the pipeline as diffusers ships it). Counts
    leave out the lab's own syncs at the call boundaries; on a CPU-only run they are host scalar reads."""

    fixes: list[str]
    per_call: int
    steps_run: int
    in_loop: int  # inside the denoising loop, all steps
    first_step: int  # in step 0 (a begin index found by `nonzero().item()` shows here)
    before_loop: int
    after_loop: int
    scalar_reads: int  # `aten::_local_scalar_dense` (`.item()`, `bool(tensor)`, ...): each a sync on a GPU
    htod: int | None = None  # host-to-device copies per call; None: a CPU-only run has none to count
    dtoh: int | None = None
    cpu_gaps_ms: float | None = None  # host time between consecutive transformer calls, summed over the call
    cpu_gap_max_ms: float | None = None
    # what the host ran in those gaps: the functions with the most self time over them, {function, self_ms}, most
    # first (a census measured before it recorded them has none)
    gap_fillers: list[dict[str, Any]] = []
    gpu_idle_loop_ms: float | None = None  # no kernel, copy or memset running, inside the denoising loop; None: CPU
    sites: list[dict[str, Any]] = []  # {path, function, count, phases, per_step}
    trace: str = ""
    #: the device work by kind, per step (`lab.traces.work.summary`); None in a census measured before it
    work: dict[str, Any] | None = None

    @property
    def in_loop_per_step(self) -> float:
        return self.in_loop / self.steps_run if self.steps_run else 0.0


#: a census's `error` when a Ctrl-C or a time limit stopped it before its arms completed: owed, not failed
CENSUS_INTERRUPTED = "interrupted"


class CensusResult(ResultHeader, kw_only=True):
    """One pipeline of `lab census`: one build profiled without fixes, with each applicable fix alone and with all
    of them together. `error`: the pipeline failed (before or during its arms), or `CENSUS_INTERRUPTED`; `arms` holds
    what completed."""

    kind: str = "census"
    size: str
    layers: int | None = None
    build: str | None = None
    settings: list[str] = []
    diffusers: str | None = None  # the version `--diffusers` asked for (it names the result); None: the installed one
    steps: int
    mode: str
    environment: Environment
    what: str = ""
    arms: list[CensusArm] = []
    skipped: list[str] = []  # the catalog's fixes that do not apply here, and why
    error: str | None = None
    #: the GPU-side waste one watched call found without fixes (`lab.measure.waste.watch_call`: sites with file and
    #: line, attention signatures, block classes); None in a census measured before it
    waste: dict[str, Any] | None = None
    #: compiled: the compiler's warnings and graph breaks in the first calls (`lab.measure.waste.compiler_notes`)
    compiler: dict[str, Any] | None = None

    @property
    def baseline(self) -> CensusArm | None:
        return next((a for a in self.arms if not a.fixes), None)

    @property
    def interrupted(self) -> bool:
        return self.error == CENSUS_INTERRUPTED

    @property
    def fixes_run(self) -> set[str]:
        """Every fix that one of the arms ran."""
        return {name for arm in self.arms for name in arm.fixes}

    @property
    def all_fixes(self) -> CensusArm | None:
        """The arm with every applicable fix (the one fix when only one applies); None without fixes."""
        fixed = [a for a in self.arms if a.fixes]
        return max(fixed, key=lambda a: len(a.fixes)) if fixed else None


class OverheadReport(ResultHeader, kw_only=True):
    """One `lab profile --report`: where the host time of one profiled call goes. The analysis stays as the trace
    analyzers make it (`lab.traces.analysis`): the CPU gaps, the gap attribution, the compile section and the
    checklist."""

    kind: str = "overhead"
    size: str
    layers: int | None = None
    steps: int
    mode: str
    build: str | None = None
    settings: list[str] = []
    fixes: list[str]
    environment: Environment
    wall_ms: float
    steps_ms: list[float]
    cpu_gaps: dict[str, Any]
    gaps: dict[str, Any]
    compile: dict[str, Any]
    checklist: list[dict[str, Any]]
    compiler_log: dict[str, Any] | None = None

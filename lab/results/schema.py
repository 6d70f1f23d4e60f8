"""The typed results: what `lab ab`, `sweep`, `hunt`, `history`, `census`, `calibrate` and `profile --report` write, as
msgspec structs.

A result file is JSON; :func:`load` turns its parsed content into one of these structs (checking every field's type,
upgrading older formats first), :func:`dump` turns a struct back into the JSON the file holds. Readers use
attributes (`result.verdict`, `result.stats.ratio`); only the bulky trace metrics of a profile (`profile`,
`compilation`, a hunt's `sites`, an overhead report's analysis) stay plain dicts, as the trace analysis makes them.

Format history (`FORMAT_VERSION`):
- 1: first version (kind "ab": samples, stats, verify, profile deltas, environment, command).
- 2: verdicts read off one Hodges-Lehmann interval, fixed or sequential design (`lab.verdicts.stats`); `lab table
  --restat` upgrades a format-1 file by deciding its stored blocks again (`lab.results.restat`).
- 3: the verdict is a value of :class:`~lab.verdicts.verdict.Verdict` ("faster"), no longer its words ("faster,
  within ±1%": the words come from the value and the statistics' equivalence). A format-2 file is upgraded as it is
  read (:func:`upgrade`); it is rewritten only by `lab table --restat`.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from lab.results.states import RESUMABLE
from lab.verdicts.verdict import Verdict

FORMAT_VERSION = 3


class _Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class Environment(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where a result was measured (`lab.results.store.environment`)."""

    device: str = ""
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str = ""
    diffusers: str = ""
    #: whose hooks model CPU offloading runs (`model_offload_keep_host` patches them); None in results before it
    accelerate: str | None = None
    python: str | None = None
    cpu: str | None = None
    cpus: int | None = None
    lab_commit: str | None = None
    #: campaign jobs started to measure at once on its host (`lab.results.store.host_jobs`: a campaign's workers
    #: times the campaigns `campaigns/device.sh` runs side by side), None outside a campaign and in results from
    #: before it was recorded
    host_jobs: int | None = None
    #: the host's copy rates in GB/s between its memory and the GPU (`lab.run.copy_rates`: host to device from
    #: pageable and pinned memory, device to host into new, kept and pinned memory), which an offloading setting's
    #: speed rests on; None on a CPU and in results from before they were recorded
    copy_rates: dict[str, float] | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


class CompileOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`lab.run.runner.CompileSpec` as stored."""

    mode: str = "eager"
    regional: bool = True
    fullgraph: bool = False
    compile_mode: str | None = None
    backend: str = "inductor"


class Timing(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the blocks were timed (`lab.measure.ab.ABConfig` as stored; a sweep stores the fixed-design subset)."""

    blocks: int | None = None
    min_blocks: int | None = None
    max_blocks: int | None = None
    budget_s: float | None = None
    lead_in: int = 0
    warmup: int = 0
    repeat: int = 1
    alpha: float = 0.05
    margin: float = 0.01
    seed: int = 0
    profile: bool = True
    with_stack: bool = True
    profile_calls: int = 1
    timing_lock: str | None = None
    one_pair: bool = False
    pairs_at_once: int = 1


class ChangedLines(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """For a change given as a diff: how many of its changed lines ran in the verifying call."""

    changed: int
    ran: int
    not_run: list[str] = []


class CompilerRounding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A compiled A/B whose outputs differed beyond the tolerance, checked against the compiler's own rounding: both
    arms once more with the compiled code run eagerly (`lab.measure.ab.within_compiler_rounding`)."""

    eager_diff: float  # the arms' difference run eagerly: what the fix changes in the computation
    control_compiled_vs_eager: float  # what compiling changes in each arm's output
    test_compiled_vs_eager: float
    accepted: bool  # the arms equal eagerly, and apart compiled by no more than compiling moves either


class Numerics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Outputs that differed beyond the tolerance, both held against a reference of higher precision
    (`lab.verdicts.numerics`): each arm's relative error against it and what the rule made of them."""

    label: str  # "numerically equivalent" or "outputs differ"
    reference: str  # "float32 on cuda"
    control_error: float | None = None  # None: not checked (`reason` says why)
    test_error: float | None = None
    bound: float | None = None  # the largest test error the rule accepts
    reason: str = ""
    noise_replayed: str | None = None  # "2 of 2": the reference started from the arms' own noise

    @property
    def accepted(self) -> bool:
        return self.label == "numerically equivalent"


class Verify(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The verifying calls: both arms' outputs with one seed, and whether the fixes' code ran."""

    identical: bool = False
    max_abs_diff: float | None = None
    tolerance: float | None = None
    within_tolerance: bool = True
    exercised: dict[str, int] = {}
    calls_counted: dict[str, int] = {}
    output_shape: list[int] | None = None
    lines: dict[str, ChangedLines] | None = None
    detail: str | None = None
    compiler_rounding: CompilerRounding | None = None
    #: outputs apart beyond the tolerance held against a reference of higher precision
    numerics: Numerics | None = None
    #: for a fix that changes the outputs on purpose (a cache's decisions), eager, in a cache setting: how far the
    #: setting itself moves the control's output (one call without it), what the fix's difference reads against
    setting_moves: float | None = None
    #: what a setting decided from the data in each arm's verifying call ("control"/"test" -> `first_block_cache:
    #: computed` / `: skipped` -> transformer calls); the test arm's from its counting call when compiled
    decisions: dict[str, dict[str, int]] | None = None
    #: how long the verifying calls took, kept with them as a profile's time is
    seconds: float | None = None
    #: the `created` of the run that made this verification, where a run going on kept it (compiled, its warm-up alone
    #: reaching what the blocks time: `lab.measure.ab.kept_verification`); None where this run made it
    kept_from: str | None = None

    @property
    def equality(self) -> str:
        """How the outputs compared: "bit-identical", "within the tolerance", "within the compiler's rounding",
        "numerically equivalent" or "outputs differ"."""
        if self.identical:
            return "bit-identical"
        if not self.within_tolerance:
            return "outputs differ"
        if self.numerics is not None and self.numerics.accepted:
            return "numerically equivalent"
        if self.compiler_rounding is not None and self.compiler_rounding.accepted:
            return "within the compiler's rounding"
        return "within the tolerance"


class ArmSamples(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One arm's timings: per block (`wall_ms`, `steps_ms`: the median of its timed calls) and per call."""

    wall_ms: list[float] = []
    steps_ms: list[list[float]] = []
    raw_wall_ms: list[list[float]] = []
    raw_steps_ms: list[list[list[float]]] = []


class Samples(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    control: ArmSamples
    test: ArmSamples


class Stats(_Struct, kw_only=True):
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
        else the faster/slower one (which also holds "faster, within ±m")."""
        if self.equivalent and not self.direction:
            return self.ci_equivalence, self.level_equivalence
        return self.ci, self.level


class Look(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One look of a sequential design: the interval after `n` blocks."""

    n: int
    ratio: float
    ci: tuple[float, float]
    ci_equivalence: tuple[float, float]
    verdict: str


class Segment(_Struct, kw_only=True):
    """One run's share of a result that `lab ab --resume` continued."""

    created: str
    command: str
    blocks: int
    stopped: str | None = None
    driver: str | None = None
    lab_commit: str | None = None
    control_median_ms: float | None = None
    #: the host's CPUs (`os.cpu_count()`): runs on hosts of another size were on other hosts (the lent H200 hosts of
    #: two and four GPUs have 32 and 64), which a moved control median may owe to
    cpus: int | None = None
    #: campaign jobs started to measure at once on that host (`Environment.host_jobs`): campaigns that each copy
    #: every weight back after each forward slow each other's control calls, as the host's own load does
    host_jobs: int | None = None


class _Result(_Struct, kw_only=True):
    """What every typed result starts with: its format and kind, its name, when and by which command it was made,
    and the scenario it measured."""

    format: int = FORMAT_VERSION
    kind: str = ""
    name: str
    created: str
    command: str
    scenario: str


class Workers(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a cross-process A/B paired its worker processes over the blocks (`lab.run.worker.WorkerPairs`)."""

    design: str  # "fresh pair per block" or "one pair"
    pairs: int
    processes: int
    start_s_median: float | None = None
    at_once: int | None = None  # pairs started side by side, ahead of their blocks
    unused: int | None = None  # of those, processes closed unused (the run decided first)
    stall_first_ms: float | None = None
    stall_ms: dict[str, float] | None = None


class _Measured:
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


class ABResult(_Measured, _Result, kw_only=True):
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


class SweepPoint(_Measured, _Struct, kw_only=True):
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


class SweepResult(_Result, kw_only=True):
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


class HuntResult(_Result, kw_only=True):
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


class CensusArm(_Struct, kw_only=True):
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


class CensusResult(_Result, kw_only=True):
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


class HistoryRow(_Struct, kw_only=True):
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


class HistoryResult(_Result, kw_only=True):
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


class CalibrationTrial(_Struct, kw_only=True):
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


class CalibrationTrials(_Struct, kw_only=True):
    aa: list[CalibrationTrial] = []
    positive: list[CalibrationTrial] = []


class _Effort(_Struct, kw_only=True):
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


class CalibrationResult(_Result, kw_only=True):
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


class OverheadReport(_Result, kw_only=True):
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


Result = Union[ABResult, SweepResult, HuntResult, HistoryResult, CensusResult, CalibrationResult, OverheadReport]
#: the struct of each kind
TYPES: dict[str, type] = {"ab": ABResult, "sweep": SweepResult, "hunt": HuntResult, "history": HistoryResult,
                          "census": CensusResult, "calibration": CalibrationResult, "overhead": OverheadReport}


def _verdict(text: str | None) -> str | None:
    return None if text is None else Verdict.from_text(text).value


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A format-2 result as format 3 (in place): each verdict's words become its value."""
    if data.get("format") != 2:
        return data
    if data.get("kind") == "ab" and "verdict" in data:
        data["verdict"] = _verdict(data["verdict"])
    for point in data.get("points") or () if data.get("kind") == "sweep" else ():
        if isinstance(point, dict) and "verdict" in point:
            point["verdict"] = _verdict(point["verdict"])
    for row in data.get("releases") or () if data.get("kind") == "history" else ():
        if not isinstance(row, dict):
            continue
        if row.get("verdict") == "reference" or row.get("status") == "reference":
            row.pop("verdict", None)  # the status says it
        elif row.get("verdict"):
            row["equivalent"] = "within" in row["verdict"]
            row["verdict"] = _verdict(row["verdict"])
    data["format"] = FORMAT_VERSION
    return data


def load(data: dict[str, Any]) -> Result:
    """The struct of a result file's parsed JSON (of a typed kind), its format upgraded first. Raises
    `msgspec.ValidationError` (what is wrong, and where: `$.stats.ci`) or `ValueError` (an unknown verdict)."""
    kind = data.get("kind")
    if kind not in TYPES:
        raise ValueError(f"kind {kind!r} has no typed result (typed: {', '.join(TYPES)})")
    return msgspec.convert(upgrade(data), TYPES[kind])


def dump(result: Result) -> dict[str, Any]:
    """The JSON-ready content of a result file: every field, those at their defaults too."""
    out = msgspec.to_builtins(result, enc_hook=_builtin)
    return {"format": result.format, "kind": result.kind, **out}  # always written, though they are the defaults


def _builtin(obj: Any) -> Any:
    """What the trace analysis may leave in a profile: numpy scalars and arrays, str subclasses (torch's version)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"a result cannot hold {type(obj).__name__}")


def replace(result: Result, **changes: Any) -> Result:
    return msgspec.structs.replace(result, **changes)

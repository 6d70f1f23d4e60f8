"""Where and how a result was measured, as stored: the host (`Environment`), the compile options, how the blocks
were timed (`Timing`), how a cross-process A/B paired its worker processes (`Workers`), and the runs a resumed
result was made in (`Segment`)."""

from __future__ import annotations

import msgspec

from lab.results.header import Strict


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
    #: the host's memory in GB (`lab.base.host_memory.total_gb`): what an offloading setting's host copies must fit
    #: in; None where it could not be read and in results from before it was recorded
    host_memory_gb: float | None = None

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
    bound: str = "off"  # the trace's bound (`ABConfig.bound`); a result from before the bound read none


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


class Segment(Strict, kw_only=True):
    """One run's share of a result that `lab ab --resume` continued."""

    created: str
    command: str
    blocks: int
    stopped: str | None = None
    driver: str | None = None
    lab_commit: str | None = None
    control_median_ms: float | None = None
    #: the host's CPUs (`os.cpu_count()`): runs on hosts of another size were on other hosts (a host of more GPUs has
    #: more CPUs), which a moved control median may owe to
    cpus: int | None = None
    #: campaign jobs started to measure at once on that host (`Environment.host_jobs`): campaigns that each copy
    #: every weight back after each forward slow each other's control calls, as the host's own load does
    host_jobs: int | None = None

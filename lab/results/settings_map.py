"""The result of `lab settings --pipeline`: each memory and speed setting (and pairs that compose) of one pipeline,
upstream and with the catalog's fixes, as the peak GPU memory and the time of its calls (`SettingsMapResult`)."""

from __future__ import annotations

from typing import Any

from lab.results.conditions import Environment
from lab.results.header import ResultHeader, Strict


class SettingPoint(Strict, kw_only=True):
    """One setting in one arm: what ran (`settings`, their words; `fixes`, the catalog's fixes on), its calls' times
    (`calls_ms`; `call_ms` their median), the peak GPU memory over them (allocated by torch, and reserved by its
    allocator: what the device must hold), the bytes its profiled call copied each way, where that call's device time
    went (`device`: `lab.traces.transfers.device_split`'s parts in µs, the copies' counts and the call's
    `profiled_ms`), its offload limit where it offloads (`lab.verdicts.offload_limit`) and the host memory it took.
    `error`: why it could not run (out of memory, a setting refused, the process killed in it), and
    `note`: how its calls were taken where that differs from the rest (one call, a slow setting)."""

    setting: str  # the setting's tag as results name it ("none", "group_offload-stream", ...)
    arm: str  # "upstream" or "fixed"
    settings: list[str] = []
    fixes: list[str] = []
    calls_ms: list[float] = []
    call_ms: float | None = None
    peak_allocated_gb: float | None = None
    peak_reserved_gb: float | None = None
    h2d_bytes: int | None = None
    d2h_bytes: int | None = None
    device: dict[str, float] | None = None
    offload: dict[str, float] | None = None
    error: str = ""
    note: str = ""
    #: what measuring it took: its calls and its profile, and turning its setting on (in the setting's first arm
    #: measured) and off (in its last); maps measured before a setting stayed on for both arms count both in each
    took_s: float | None = None
    #: the process's peak resident host memory over the point (GB; pinned copies count): what the setting costs the
    #: host, beside the weights it holds anyway; None where the peak could not be reset (`lab.base.host_memory`)
    host_peak_gb: float | None = None
    #: the times the process ended while measuring it (killed, most likely for host memory): stored before each point
    ended: int = 0
    #: what the host did while the device sat idle, from one more call profiled with its Python functions (`lab
    #: settings --host-trace`; `lab.measure.settings_map.host_in_idle`): that call's time, the idle gaps' total and
    #: count, and the functions and callers that filled them most
    host_in_idle: dict[str, Any] | None = None


#: what joins the commands of a map that went on from an earlier one (`lab settings --resume`), oldest first
THEN = "; then "


class SettingsMapResult(ResultHeader, kw_only=True):
    """One pipeline's settings map: every point, on one build, on one device."""

    kind: str = "settings-map"
    size: str
    layers: int | None = None
    steps: int
    environment: Environment
    params: int | None = None
    weights_gb: float | None = None  # the denoiser's and the other models' weights, as built
    compute_ms: float | None = None  # the call without any setting: the compute every offload limit is set against
    #: each measuring process's first call, with nothing on, taken before its first point and timed for no point, so
    #: that no point carries what a process's first call pays (kernel loading, library handles, the allocator's
    #: growth); one per process that measured points, in order (a map gone on from another has several)
    first_calls_ms: list[float] = []
    points: list[SettingPoint] = []
    interrupted: bool = False
    extra: dict[str, Any] | None = None

    @property
    def went_on(self) -> bool:
        """Whether more than one process measured it (its environment, copy rates included, is the latest's)."""
        return THEN in self.command

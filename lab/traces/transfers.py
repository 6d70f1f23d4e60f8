"""The copies between host and device in a trace: bytes, count and device time by direction and host memory.

The profiler names each copy by its direction and its host memory (`Memcpy HtoD (Pageable -> Device)`,
`Memcpy DtoH (Device -> Pinned)`) and records its bytes. An offloaded call's floor is set by the bytes it moves each
way (`lab.verdicts.offload_limit`), and whether they came from pageable or pinned memory says which of the host's copy
rates applies to them.
"""

from __future__ import annotations

import re

import numpy as np

from lab.traces.timeline import union_length, us
from lab.traces.trace import Trace

#: `Memcpy HtoD (Pageable -> Device)`: the direction, then the memory on each side
_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
DIRECTIONS = ("HtoD", "DtoH")


def transfer_analysis(trace: Trace) -> dict:
    """Per direction (`HtoD`, `DtoH`; a copy within the device is not a transfer): the bytes, count and device time
    (µs) in all, and the same by the host memory it came from or went to (`pageable`, `pinned`)."""
    copies = trace.cat("gpu_memcpy")
    nbytes = copies.extra.get("bytes", np.zeros(len(copies), dtype=np.int64))
    out: dict[str, dict] = {d: {"bytes": 0, "count": 0, "us": 0.0, "by_memory": {}} for d in DIRECTIONS}
    for name, size, dur in zip(copies.names, nbytes, copies.dur):
        m = _NAME.match(name)
        if not m or m.group(1) not in out:
            continue
        direction = m.group(1)
        memory = (m.group(2) if direction == "HtoD" else m.group(3)).lower()
        for where in (out[direction], out[direction]["by_memory"].setdefault(memory, {"bytes": 0, "count": 0,
                                                                                      "us": 0.0})):
            where["bytes"] += int(size)
            where["count"] += 1
            where["us"] += us(int(dur))
    return out


def device_split(trace: Trace) -> dict:
    """Where a profiled call's device time went, from its GPU items on every stream (µs): `kernels_us`, the time some
    kernel (or memset) ran; `copies_us`, the time some host-device copy ran; `exposed_us`, the time some copy ran
    with no kernel beside it (the copies the compute did not hide); `device_us`, the time anything ran (the two
    together); `span_us`, from the first item's start to the last one's end; and per direction its copies' busy time
    (`HtoD_us`, `DtoH_us`: their union, the copy engine's time at the rate it reached). A call's wall time less `device_us` is the time the device had
    nothing to do (the host was behind: hooks, launches, waits). Copies within the device count as compute."""
    kernels = [trace.cat("kernel"), trace.cat("gpu_memset")]
    copies = trace.cat("gpu_memcpy")
    direction = np.array([(_NAME.match(n).group(1) if _NAME.match(n) else "") for n in copies.names], dtype=object)
    moved = np.isin(direction, DIRECTIONS)
    kernels.append(copies.where(~moved))
    k_ts = np.concatenate([k.ts for k in kernels])
    k_end = np.concatenate([k.end for k in kernels])
    c_ts, c_end = copies.ts[moved], copies.end[moved]
    kernel_us, _, _ = union_length(k_ts, k_end)
    device, _, _ = union_length(np.concatenate([k_ts, c_ts]), np.concatenate([k_end, c_end]))
    copies_us, _, _ = union_length(c_ts, c_end)
    out = {"kernels_us": us(kernel_us), "copies_us": us(copies_us), "exposed_us": us(device - kernel_us), "device_us": us(device),
           "span_us": us(int(max(k_end.max(initial=0), c_end.max(initial=0)))
                         - int(min(k_ts.min(initial=2**62), c_ts.min(initial=2**62)))) if device else 0.0}
    for d in DIRECTIONS:
        sel = direction[moved] == d
        busy, _, _ = union_length(c_ts[sel], c_end[sel])
        out[f"{d}_us"] = us(busy)
    return out

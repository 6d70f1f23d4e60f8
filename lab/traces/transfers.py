"""The copies between host and device in a trace: bytes, count and device time by direction and host memory.

The profiler names each copy by its direction and its host memory (`Memcpy HtoD (Pageable -> Device)`,
`Memcpy DtoH (Device -> Pinned)`) and records its bytes. An offloaded call's floor is set by the bytes it moves each
way (`lab.verdicts.offload_limit`), and whether they came from pageable or pinned memory says which of the host's copy
rates applies to them.
"""

from __future__ import annotations

import re

import numpy as np

from lab.traces.timeline import us
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

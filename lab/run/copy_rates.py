"""The host's copy rates between its memory and the GPU, which every offloading setting's speed rests on.

A verdict of an offloading fix holds on a host with these rates: a pinned copy runs at the link's speed, a pageable
one at what the host's memory copies allow, and `.to("cpu")` into new pageable memory at a fraction of that (it
allocates and faults in every page). Five rates, each of one copy of `SIZE` bytes after a warm-up copy, the median of
`REPEATS`, timed with CUDA events around the copy alone:

- `h2d_pageable`, `h2d_pinned`: host to device, from pageable and from pinned memory;
- `d2h_new_pageable`: device to host into newly allocated pageable memory (what `tensor.to("cpu")` does);
- `d2h_kept_pageable`: into pageable memory allocated once and kept (`host.copy_(device)`);
- `d2h_pinned`: into pinned memory.

Measured once per process on a CUDA device (a few seconds), and kept on disk per host, GPU and boot, so that a
campaign's many processes measure once; None on a machine without CUDA. Results record them in their environment.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

SIZE = 1 << 30  # bytes per copy: large enough that the copy's set-up is a rounding error
REPEATS = 3
RATES = ("h2d_pageable", "h2d_pinned", "d2h_new_pageable", "d2h_kept_pageable", "d2h_pinned")
_measured: dict[str, dict[str, float]] = {}


def rates(device: str) -> dict[str, float] | None:
    """The five rates in GB/s (1e9 bytes per second) of this host and `device`'s GPU, or None without CUDA."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    key = _host_key(torch.cuda.get_device_name(torch.device(device)))
    if key not in _measured:
        stored = _cache_file(key)
        try:
            found = json.loads(stored.read_text())
            if sorted(found) == sorted(RATES) and all(isinstance(v, (int, float)) and v > 0 for v in found.values()):
                _measured[key] = found
        except (OSError, ValueError, TypeError):
            pass  # none stored, or damaged: measured afresh
        if key not in _measured:
            _measured[key] = measure(torch.device(device))
            try:
                stored.parent.mkdir(parents=True, exist_ok=True)
                stored.write_text(json.dumps(_measured[key]))
            except OSError:
                pass  # a read-only cache costs a measurement per process, not a wrong figure
    return dict(_measured[key])


def measure(device, size: int = SIZE, repeats: int = REPEATS) -> dict[str, float]:
    """Time the five copies on `device` (a CUDA device) and return their rates in GB/s."""
    import torch

    rates = _time_copies(device, size, repeats)
    torch.cuda.empty_cache()  # the buffers are gone with _time_copies' frame: give their memory back to the device
    return rates


def _time_copies(device, size: int, repeats: int) -> dict[str, float]:
    import torch

    elements = size // 2
    on_device = torch.empty(elements, dtype=torch.bfloat16, device=device).normal_()
    pageable = torch.empty(elements, dtype=torch.bfloat16).normal_()
    pinned = torch.empty(elements, dtype=torch.bfloat16, pin_memory=True)
    kept = torch.empty(elements, dtype=torch.bfloat16)
    target = torch.empty(elements, dtype=torch.bfloat16, device=device)
    copies = {
        "h2d_pageable": lambda: target.copy_(pageable),
        "h2d_pinned": lambda: target.copy_(pinned, non_blocking=True),
        "d2h_new_pageable": lambda: on_device.to("cpu"),
        "d2h_kept_pageable": lambda: kept.copy_(on_device),
        "d2h_pinned": lambda: pinned.copy_(on_device, non_blocking=True),
    }
    out = {}
    for name, copy in copies.items():
        copy()  # warm-up: first-touch of the pages, the driver's staging buffers
        torch.cuda.synchronize(device)
        seconds = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        out[name] = round(size / statistics.median(seconds) / 1e9, 2)
    return out


def _host_key(gpu: str) -> str:
    """Host, GPU and boot: the rates change with any of them (a reboot can change the memory's layout and the link)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{platform.node()}|{gpu}|{boot}"


def _cache_file(key: str) -> Path:
    import hashlib

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lab" / "copy_rates"
    return root / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

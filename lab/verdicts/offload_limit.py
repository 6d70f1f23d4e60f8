"""How close an offloaded call runs to what its copies and its compute allow.

An offloaded call moves its weights between host and device and computes with them. Its copies cannot run faster
than the host's pinned copy rates (`lab.run.copy_rates`: the link's own speed; pageable memory is slower), and its
compute cannot run faster than the same call without offloading (measured). Two limits follow:

- **overlap**: every copy hidden behind the compute and the two directions behind each other, the call takes the
  longest of the three: `max(compute, HtoD bytes / HtoD rate, DtoH bytes / DtoH rate)`;
- **serial**: nothing overlapped: `compute + HtoD time + DtoH time`.

A call's time as a multiple of the overlap limit is how far its setting, as implemented, is from what the host allows
(1.0 is at the limit); the serial limit says how much of that distance overlap alone could close. The bytes are the
call's own (its trace's copy events), so a fix that stops copying weights back lowers its limit too.
Pure: no torch, no IO.
"""

from __future__ import annotations

import dataclasses

#: the copy rates a limit is read at: the pinned ones, the fastest the host offers each way
H2D_RATE, D2H_RATE = "h2d_pinned", "d2h_pinned"
#: a call within this multiple of its overlap limit is at the limit; one past it has an obstacle to name
AT_LIMIT = 1.3


@dataclasses.dataclass(frozen=True)
class OffloadLimit:
    """One arm's offloaded call against its limits (times in ms, bytes per call, rates in GB/s)."""

    call_ms: float
    compute_ms: float
    h2d_bytes: int
    d2h_bytes: int
    h2d_gbs: float
    d2h_gbs: float

    @property
    def h2d_ms(self) -> float:
        return self.h2d_bytes / (self.h2d_gbs * 1e9) * 1e3

    @property
    def d2h_ms(self) -> float:
        return self.d2h_bytes / (self.d2h_gbs * 1e9) * 1e3

    @property
    def overlap_ms(self) -> float:
        return max(self.compute_ms, self.h2d_ms, self.d2h_ms)

    @property
    def serial_ms(self) -> float:
        return self.compute_ms + self.h2d_ms + self.d2h_ms

    @property
    def multiple(self) -> float:
        """The call's time over the overlap limit."""
        return self.call_ms / self.overlap_ms

    @property
    def multiple_serial(self) -> float:
        """The call's time over the serial limit (below 1: some copies overlap the compute)."""
        return self.call_ms / self.serial_ms

    def summary(self) -> str:
        gb = (self.h2d_bytes + self.d2h_bytes) / 1e9
        return (f"{self.call_ms:,.1f} ms per call, {self.multiple:.2f}x the overlap limit of "
                f"{self.overlap_ms:,.1f} ms ({self.multiple_serial:.2f}x the serial limit of {self.serial_ms:,.1f} ms): {gb:,.2f} GB copied "
                f"({self.h2d_bytes / 1e9:,.2f} to the device at {self.h2d_gbs:g} GB/s, {self.d2h_bytes / 1e9:,.2f} "
                f"back at {self.d2h_gbs:g} GB/s) beside {self.compute_ms:,.1f} ms of compute without offloading")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "h2d_ms": self.h2d_ms, "d2h_ms": self.d2h_ms,
                "overlap_ms": self.overlap_ms, "serial_ms": self.serial_ms, "multiple": self.multiple,
                "multiple_serial": self.multiple_serial}


def offload_limit(call_ms: float, compute_ms: float, h2d_bytes: int, d2h_bytes: int,
                  rates: dict[str, float]) -> OffloadLimit:
    """The limits of one offloaded call from its time, its compute without offloading, the bytes its trace copied
    each way and the host's copy rates (`lab.run.copy_rates.RATES`, GB/s)."""
    if call_ms <= 0 or compute_ms <= 0:
        raise ValueError(f"times must be positive (call {call_ms} ms, compute {compute_ms} ms)")
    if h2d_bytes < 0 or d2h_bytes < 0:
        raise ValueError("bytes copied cannot be negative")
    missing = [k for k in (H2D_RATE, D2H_RATE) if not rates.get(k) or rates[k] <= 0]
    if missing:
        raise ValueError(f"the host's copy rates lack {', '.join(missing)}")
    return OffloadLimit(call_ms=call_ms, compute_ms=compute_ms, h2d_bytes=int(h2d_bytes), d2h_bytes=int(d2h_bytes),
                        h2d_gbs=rates[H2D_RATE], d2h_gbs=rates[D2H_RATE])


#: what holds an offloaded call above its limit, by the part of its profiled call it shows in (`obstacle`)
OBSTACLES = {"slow_copies": "copies slower than the host's pinned rate",
             "compute_alone": "compute beside no copy (copies and compute in turn)",
             "exposed": "copies the compute does not hide", "kernels": "kernels slower than without offloading",
             "idle": "the device waiting on the host"}


def obstacle(limit: OffloadLimit, split: dict[str, float], profiled_ms: float) -> dict:
    """What holds an offloaded call above its overlap limit, from one profiled call (`profiled_ms`, its wall time)
    and its device split (`lab.traces.transfers.device_split`, µs): the parts of the call past what the limit
    allows (ms), the largest naming the obstacle. Pure.

    Where the copies bound the limit (they take longer at the pinned rates than the compute), the call at its limit
    keeps the copy engine busy throughout; past it are the copies' time beyond their time at the pinned rates
    (`slow_copies`), the time kernels ran beside no copy (`compute_alone`: the copies waited for the compute, as on
    one stream) and the time the device had nothing to do (`idle`). Where the compute bounds it, the call at its
    limit is its compute; past it are the kernels' time beyond the call without offloading (`kernels`), the copies
    beside no kernel (`exposed`) and `idle`. `idle` is the profiled call less its device time: the host was behind
    (hooks, launches, waits on events). The parts add up to the call's distance from its limit, less where the
    kernels ran faster than the call without offloading took."""
    kernels_ms, device_ms = split["kernels_us"] / 1e3, split["device_us"] / 1e3
    copies_ms = split.get("copies_us", split["HtoD_us"] + split["DtoH_us"]) / 1e3
    idle = max(0.0, profiled_ms - device_ms)
    copy_bound = max(limit.h2d_ms, limit.d2h_ms) > limit.compute_ms
    if copy_bound:
        parts = {"slow_copies": max(0.0, copies_ms - limit.overlap_ms), "compute_alone": device_ms - copies_ms,
                 "idle": idle}
    else:
        parts = {"kernels": max(0.0, kernels_ms - limit.compute_ms), "exposed": split["exposed_us"] / 1e3,
                 "idle": idle}
    largest = max(parts, key=parts.get)
    reached = {d: (nbytes / (split[f"{d}_us"] * 1e3) if split.get(f"{d}_us") else None)
               for d, nbytes in (("HtoD", limit.h2d_bytes), ("DtoH", limit.d2h_bytes))}
    rates = "; ".join(f"{'to' if d == 'HtoD' else 'from'} the device at {gbs:,.1f} GB/s while copying (pinned: "
                      f"{limit.h2d_gbs if d == 'HtoD' else limit.d2h_gbs:g})" for d, gbs in reached.items() if gbs)
    bound = (f"its copies bound its limit ({limit.overlap_ms:,.0f} ms at the pinned rates, beside "
             f"{limit.compute_ms:,.0f} ms of compute)" if copy_bound else
             f"its compute bounds its limit ({limit.compute_ms:,.0f} ms, the call without offloading)")
    text = (f"{OBSTACLES[largest]}: {bound}; of a profiled call of {profiled_ms:,.0f} ms, kernels ran "
            f"{kernels_ms:,.0f} ms, copies {copies_ms:,.0f} ms, the two together {device_ms:,.0f} ms, the device idle "
            f"{idle:,.0f} ms" + (f"; {rates}" if rates else ""))
    return {"largest": largest, "copy_bound": copy_bound, "text": text, "reached_gbs": reached,
            "profiled_ms": profiled_ms, "kernels_ms": kernels_ms, "copies_ms": copies_ms, "parts_ms": parts}

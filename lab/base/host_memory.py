"""The host's memory as Linux reports it: its total, and this process's peak resident set over a span (`reset_peak`,
then `peak_gb`). Offloading keeps the weights in host memory (pinned copies too, which count as resident), so the
peak over a setting's calls is what that setting costs the host. Where the kernel's files cannot be read or the peak
cannot be reset (another OS, a locked-down /proc), the figures are None rather than the process's peak since it
started, which would charge one setting with another's memory."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _kib(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


def total_gb(proc: Path = PROC) -> float | None:
    """The host's memory (MemTotal), in GB."""
    kib = _kib(proc / "meminfo", "MemTotal")
    return kib * 1024 / 1e9 if kib is not None else None


def reset_peak(proc: Path = PROC) -> bool:
    """Set this process's peak resident set to its current one (`5` into clear_refs); whether it could."""
    try:
        (proc / "self" / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_gb(proc: Path = PROC) -> float | None:
    """This process's peak resident set since its last `reset_peak` (VmHWM), in GB."""
    kib = _kib(proc / "self" / "status", "VmHWM")
    return kib * 1024 / 1e9 if kib is not None else None


def empty_host_cache() -> None:
    """Give the pinned memory torch's host allocator caches back to the host, once no copy still reads it: the
    allocator keeps freed pinned blocks (rounded up to a power of two) for reuse, so memory a setting pinned stays
    the process's after the setting is undone, and the next one would be charged with it."""
    import torch

    if not torch.cuda.is_initialized():
        return
    torch.cuda.synchronize()
    # the public call where torch has it, else the one of CUDA builds that torch's own CUDA graphs call
    empty = getattr(torch.accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()

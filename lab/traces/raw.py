"""The bytes of a trace file: read, decompressed and checked against the memory there is, before any parsing.

Light on purpose (the standard library only), so that `lab analyze` can start reading a trace in a thread while
it imports the analyzers: zlib decompresses without holding the interpreter lock, and decompressing is a large
share of a large trace's analysis.
"""

from __future__ import annotations

import gzip
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from lab.base.errors import LabError


def read(path: Path) -> bytes:
    """The JSON bytes of `path` (`.json`, or `.json.gz` decompressed). One-line LabError on a missing, empty or
    damaged file, or one too large for the memory available."""
    if not path.exists():
        raise LabError(f"{path}: no such file.")
    size = path.stat().st_size
    if size == 0:
        raise LabError(f"{path}: the file is empty, not a trace.")
    if path.suffix == ".gz":
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            expected = struct.unpack("<I", f.read(4))[0]  # uncompressed size mod 2**32
        _check_memory(path, max(expected, size * 10))
        try:
            return gzip.decompress(path.read_bytes())
        except (EOFError, OSError, zlib.error) as e:
            raise LabError(f"{path}: the gzip file is truncated or damaged ({e}).") from e
    _check_memory(path, size)
    return path.read_bytes()


def prefetch(path: str | os.PathLike) -> Callable[[], bytes]:
    """Start `read(path)` in a thread; the returned function waits for it and returns the bytes (or raises what
    `read` raised), once."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["data"] = read(Path(path))
        except BaseException as e:  # handed to the caller, in its own thread
            box["error"] = e

    thread = threading.Thread(target=work, name=f"read {path}", daemon=True)
    thread.start()

    def result() -> bytes:
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box.pop("data")  # type: ignore[return-value]  # not kept here: the parser frees the bytes once decoded

    return result


def _check_memory(path: Path, json_bytes: int) -> None:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except OSError:
        return
    if json_bytes * 3 > available:
        raise LabError(
            f"{path}: about {json_bytes / 2**30:.1f} GiB of JSON needs more memory than the {available / 2**30:.1f} GiB "
            "available. Capture fewer steps (`lab profile --profile-steps`) or without Python stacks."
        )

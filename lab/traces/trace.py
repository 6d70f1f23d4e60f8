"""Parsing a torch.profiler Chrome trace once into columns that every analyzer reads.

Decoding is typed (msgspec): only the fields the analyzers use are decoded, the rest of each event is skipped
without building Python objects. Timestamps are kept as integer nanoseconds (the trace holds microseconds with
three decimals), so unions and gaps are exact to the nanosecond instead of rounded to whole microseconds.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct
import zlib
from pathlib import Path

import msgspec
import numpy as np

from lab.base.errors import LabError

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class _Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    stream: int | None = None
    device: int | None = None
    bytes: int | None = None
    python_id: int | None = msgspec.field(default=None, name="Python id")
    python_parent: int | None = msgspec.field(default=None, name="Python parent id")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


class _TraceFile(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    deviceProperties: list[dict] | None = None
    with_stack: int | None = None
    cuda_runtime_version: int | None = None
    traceName: str | None = None


@dataclasses.dataclass
class Events:
    """One category of complete ('X') events as parallel arrays (times in integer ns)."""

    names: list[str]
    ts: np.ndarray
    dur: np.ndarray
    tid: np.ndarray
    correlation: np.ndarray
    extra: dict[str, np.ndarray]

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def __len__(self) -> int:
        return len(self.names)

    def where(self, mask: np.ndarray) -> Events:
        idx = np.flatnonzero(mask)
        return Events([self.names[i] for i in idx], self.ts[idx], self.dur[idx], self.tid[idx], self.correlation[idx],
                      {k: v[idx] for k, v in self.extra.items()})

    def named(self, *names: str) -> Events:
        wanted = set(names)
        return self.where(np.fromiter((n in wanted for n in self.names), bool, len(self.names)))


@dataclasses.dataclass
class Trace:
    """A parsed trace: events by category, plus metadata. Build with :func:`load`."""

    path: str
    by_cat: dict[str, Events]
    memory: np.ndarray  # (ts_ns, device, total_allocated) rows of `[memory]` instant events
    device_properties: list[dict]
    with_stack: bool
    main_tid: int

    def cat(self, name: str) -> Events:
        return self.by_cat.get(name) or _empty()

    @property
    def gpu(self) -> Events:
        """Kernels, memcpys and memsets on every stream, sorted by start."""
        parts = [self.cat(c) for c in GPU_CATS]
        names = [n for p in parts for n in p.names]
        ts = np.concatenate([p.ts for p in parts])
        order = np.argsort(ts, kind="stable")
        dur = np.concatenate([p.dur for p in parts])
        tid = np.concatenate([p.tid for p in parts])
        corr = np.concatenate([p.correlation for p in parts])
        return Events([names[i] for i in order], ts[order], dur[order], tid[order], corr[order], {})

    @property
    def has_gpu(self) -> bool:
        return any(len(self.cat(c)) for c in GPU_CATS)

    @property
    def annotations(self) -> Events:
        return self.cat("user_annotation")


def _empty() -> Events:
    z = np.zeros(0, dtype=np.int64)
    return Events([], z, z, z, z, {})


def _read(path: Path) -> bytes:
    if not path.exists():
        raise LabError(f"{path}: no such file.")
    size = path.stat().st_size
    if size == 0:
        raise LabError(f"{path}: the file is empty, not a trace.")
    gz = path.suffix == ".gz"
    if gz:
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


_DECODER = msgspec.json.Decoder(_TraceFile)


def load(path: str | os.PathLike) -> Trace:
    """Parse a torch.profiler Chrome trace (`.json` or `.json.gz`). Raises LabError with one line on bad input."""
    path = Path(path)
    data = _read(path)
    try:
        parsed = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise LabError(f"{path}: not a torch.profiler trace ({e}).") from e
    except msgspec.DecodeError as e:
        raise LabError(f"{path}: not valid JSON ({e}).") from e
    del data
    if parsed.traceEvents is None:
        raise LabError(f"{path}: JSON without `traceEvents`: not a torch.profiler Chrome trace.")
    if not parsed.traceEvents:
        raise LabError(f"{path}: the trace has no events.")

    events = parsed.traceEvents
    memory = [(round(e.ts * 1000), e.args.device_id if e.args.device_id is not None else -1, e.args.total_allocated)
              for e in events if e.ph == "i" and e.name == "[memory]" and e.args is not None
              and e.args.total_allocated is not None]
    # one column per field over the complete ('X') events (comprehensions, not a loop with appends), then split by
    # category with one stable sort: the same arrays in the same order as a pass per event would give
    complete = [e for e in events if e.ph == "X"]
    meta = (parsed.deviceProperties or [], bool(parsed.with_stack))
    del parsed, events
    n = len(complete)
    cats = [e.cat for e in complete]
    names = [e.name for e in complete]
    ts_all = np.rint(np.fromiter((e.ts for e in complete), np.float64, n) * 1000).astype(np.int64)
    dur_all = np.rint(np.fromiter((e.dur for e in complete), np.float64, n) * 1000).astype(np.int64)
    tid_all = np.fromiter((e.tid if isinstance(e.tid, int) else -1 for e in complete), np.int64, n)
    args = [e.args for e in complete]
    del complete

    def field(name: str, missing: int) -> np.ndarray:
        return np.fromiter((missing if a is None or getattr(a, name) is None else getattr(a, name) for a in args),
                           np.int64, n)

    corr_all, stream_all = field("correlation", -1), field("stream", -1)
    bytes_all = np.fromiter((0 if a is None else (a.bytes or 0) for a in args), np.int64, n)
    codes: dict[str, int] = {}
    cat_code = np.fromiter((codes.setdefault(c, len(codes)) for c in cats), np.int64, n)
    order = np.argsort(cat_code, kind="stable")
    bounds = np.searchsorted(cat_code[order], np.arange(len(codes) + 1))
    by_cat = {}
    for cat, code in codes.items():
        idx = order[bounds[code]:bounds[code + 1]]
        extra = {"stream": stream_all[idx], "bytes": bytes_all[idx]}
        if cat == "python_function":
            sub = [args[i] for i in idx.tolist()]
            extra["pyid"] = np.fromiter((-1 if a is None or a.python_id is None else a.python_id for a in sub),
                                        np.int64, len(sub))
            extra["pyparent"] = np.fromiter((-1 if a is None or a.python_parent is None else a.python_parent
                                             for a in sub), np.int64, len(sub))
        by_cat[cat] = Events([names[i] for i in idx.tolist()], ts_all[idx], dur_all[idx], tid_all[idx],
                             corr_all[idx], extra)
    cpu_ops = by_cat.get("cpu_op")
    if cpu_ops is not None and len(cpu_ops):
        tids, counts = np.unique(cpu_ops.tid, return_counts=True)
        # the first thread with the most CPU ops, as counting them in event order picks it
        first = {t: k for k, t in reversed(list(enumerate(cpu_ops.tid.tolist())))}
        best = max(counts)
        main_tid = min((int(t) for t, c in zip(tids, counts) if c == best), key=lambda t: first[t])
    else:
        main_tid = 0
    return Trace(str(path), by_cat, np.asarray(memory, dtype=np.int64).reshape(-1, 3), meta[0], meta[1], main_tid)

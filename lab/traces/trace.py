"""Parsing a torch.profiler Chrome trace once into columns that every analyzer reads.

Decoding is typed (msgspec): only the fields the analyzers use are decoded, the rest of each event is skipped
without building Python objects. Timestamps are kept as integer nanoseconds (the trace holds microseconds with
three decimals), so unions and gaps are exact to the nanosecond instead of rounded to whole microseconds. A start is
read as a 64-bit float, which keeps every nanosecond below 2^43 µs (a clock of about 100 days); a trace with starts
beyond that has them read again from their digits (`EXACT_FROM_US`), since as floats distinct starts there would
round together and distinct events would read as duplicates.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from decimal import Decimal
from itertools import compress, repeat
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np

from lab.base.errors import LabError
from lab.traces import raw

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class _Args(msgspec.Struct, gc=False):
    # the defaults are what an event without the field stands for, so that columns are read without a test per event
    correlation: int | None = -1
    stream: int | None = -1
    device: int | None = None
    bytes: int | None = 0
    python_id: int | None = msgspec.field(default=-1, name="Python id")
    python_parent: int | None = msgspec.field(default=-1, name="Python parent id")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    external_id: int | None = msgspec.field(default=-1, name="External id")
    # what `record_shapes` adds to an operator: each argument's sizes, strides and type ([] for a non-tensor)
    input_dims: list | None = msgspec.field(default=None, name="Input Dims")
    input_strides: list | None = msgspec.field(default=None, name="Input Strides")
    input_type: list | None = msgspec.field(default=None, name="Input type")
    concrete: list | None = msgspec.field(default=None, name="Concrete Inputs")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = msgspec.field(default_factory=_Args)


class _Start(msgspec.Struct, gc=False):
    """An event's phase and start as the digits the file holds (`load` reads them so past `EXACT_FROM_US`)."""

    ph: str = ""
    ts: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"0"))


class _Starts(msgspec.Struct):
    traceEvents: list[_Start] | None = None


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


#: phases the analysis reads: complete events ('X') and instant events ('i', the memory records)
USED_PHASES = ("X", "i")
#: events further than this from the median start are not of this capture (a wrapped or mixed clock)
SPAN_NS = 24 * 3600 * 10**9
#: from this start on (µs) a 64-bit float's spacing is more than the trace's nanosecond (2^-9 µs and up), so starts
#: are read from their digits instead
EXACT_FROM_US = 2.0**43


@dataclasses.dataclass
class Checks:
    """What :func:`load` found wrong with a trace, or left out, with counts (empty when it is clean).

    `dropped`: complete events the analysis cannot use and so leaves out, by reason (a negative duration, a start
    that is negative or not a number, a start a day or more from the rest, an exact duplicate of another event).
    `zero_length`: complete events of no duration (kept: an instant op is one). `other_phases`: events of phases the
    analysis does not read (flows, metadata, counters), by phase: normal in a torch.profiler trace, and left out."""

    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    zero_length: int = 0
    other_phases: dict[str, int] = dataclasses.field(default_factory=dict)
    #: events whose starts lie past `EXACT_FROM_US`, read from their digits (0: the floats kept every nanosecond)
    exact_starts: int = 0

    def problems(self) -> list[str]:
        """What is wrong with the trace, or was done about it: what a comparison warns of."""
        out = [f"left out {n:,} complete event(s): {why}" for why, n in self.dropped.items()]
        if self.exact_starts:
            out.append(f"{self.exact_starts:,} start(s) past 2^43 µs read exactly from their digits (as 64-bit floats "
                       "they lose nanoseconds, and distinct events read as duplicates)")
        return out

    def lines(self) -> list[str]:
        """What a report says about the trace: the problems first, then what was left out."""
        out = self.problems()
        if self.zero_length:
            out.append(f"{self.zero_length:,} complete event(s) of zero duration (kept)")
        if self.other_phases:
            out.append("not read: " + ", ".join(f"{n:,} of phase '{ph}'"
                                                for ph, n in sorted(self.other_phases.items())))
        return out


@dataclasses.dataclass
class Trace:
    """A parsed trace: events by category, plus metadata. Build with :func:`load`."""

    path: str
    by_cat: dict[str, Events]
    memory: np.ndarray  # (ts_ns, device, total_allocated) rows of `[memory]` instant events
    device_properties: list[dict]
    with_stack: bool
    main_tid: int
    checks: Checks = dataclasses.field(default_factory=Checks)

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


_DECODER = msgspec.json.Decoder(_TraceFile)
_PH = attrgetter("ph")


def _objects(values: list) -> np.ndarray:
    """A 1-d object array of `values` (assigned, not converted: numpy would look into each value)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _ints(values: list, missing: int) -> np.ndarray:
    """An int64 column; a value that is not an int (an explicit null, a thread named by a string) counts as
    `missing`."""
    try:
        return np.array(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)
    except (TypeError, ValueError):
        # the few odd values replaced in one masked assignment (the test per value is a C loop, not a Python frame)
        column = _objects(values)
        column[~np.fromiter(map(isinstance, values, repeat(int)), bool, len(values))] = missing
        return column.astype(np.int64)


def load(path: str | os.PathLike, data: bytes | None = None) -> Trace:
    """Parse a torch.profiler Chrome trace (`.json` or `.json.gz`). Raises LabError with one line on bad input.
    `data`: the file's JSON bytes when they were read already (`lab.traces.raw.prefetch`)."""
    path = Path(path)
    data = raw.read(path) if data is None else data
    parsed = _decode(path, data)
    events = parsed.traceEvents
    # (a negative start is left out whatever its size: only the largest start can be past the float's nanoseconds)
    starts = _exact_starts(data) if max(map(attrgetter("ts"), events)) >= EXACT_FROM_US else None
    del data
    # columns are read with map/attrgetter/compress (loops in C, not a Python frame per event)
    phs = list(map(_PH, events))
    checks = Checks(other_phases={ph: n for ph, n in Counter(phs).items() if ph not in USED_PHASES})
    if starts is not None:
        checks.exact_starts = sum(1 for ph, t in zip(phs, starts) if ph in USED_PHASES and t >= EXACT_FROM_US * 1000)
    instants = compress(zip(events, repeat(None) if starts is None else starts), map("i".__eq__, phs))
    memory = [(round(e.ts * 1000) if ns is None else ns, e.args.device_id if e.args.device_id is not None else -1,
               e.args.total_allocated)
              for e, ns in instants if e.name == "[memory]" and e.args.total_allocated is not None]
    # one column per field over the complete ('X') events, then split by category with one stable sort: the same
    # arrays in the same order as a pass per event would give
    complete = list(compress(events, map("X".__eq__, phs)))
    exact = None if starts is None else list(compress(starts, map("X".__eq__, phs)))
    meta = (parsed.deviceProperties or [], bool(parsed.with_stack))
    del parsed, events, phs, starts
    columns = _Columns.of(complete, exact)
    del complete
    by_cat = _by_category(_usable_only(path, columns, checks))
    cpu_ops = by_cat.get("cpu_op")
    if not (cpu_ops is not None and len(cpu_ops)) and not any(len(by_cat.get(c) or ()) for c in GPU_CATS):
        raise LabError(f"{path}: neither CPU operators (cat 'cpu_op') nor GPU kernels, copies or sets: not a "
                       "torch.profiler trace of a pipeline call, nothing to analyse.")
    return Trace(str(path), by_cat, np.asarray(memory, dtype=np.int64).reshape(-1, 3), meta[0], meta[1],
                 _main_thread(cpu_ops), checks)


def _decode(path: Path, data: bytes) -> _TraceFile:
    """The trace file decoded, with at least one event; one-line errors for anything else."""
    try:
        parsed = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise LabError(f"{path}: not a torch.profiler trace ({e}).") from e
    except msgspec.DecodeError as e:
        raise LabError(f"{path}: not valid JSON ({e}).") from e
    if parsed.traceEvents is None:
        raise LabError(f"{path}: JSON without `traceEvents`: not a torch.profiler Chrome trace.")
    if not parsed.traceEvents:
        raise LabError(f"{path}: the trace has no events.")
    return parsed


@dataclasses.dataclass
class _Columns:
    """The complete events' fields as parallel columns (times in integer ns; `args` the decoded arguments)."""

    cats: list[str]
    names: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    tid: np.ndarray
    args: np.ndarray

    @classmethod
    def of(cls, complete: list[_Event], exact: list[int] | None) -> _Columns:
        """The columns of `complete`, their starts from `exact` (integer ns read from the digits) where given."""
        n = len(complete)
        ts = (np.rint(np.fromiter(map(attrgetter("ts"), complete), np.float64, n) * 1000).astype(np.int64)
              if exact is None else np.array(exact, dtype=np.int64).reshape(n))
        dur = np.rint(np.fromiter(map(attrgetter("dur"), complete), np.float64, n) * 1000).astype(np.int64)
        names = _objects(list(map(attrgetter("name"), complete)))
        tid = _ints(list(map(attrgetter("tid"), complete)), -1)
        args = _objects(list(map(attrgetter("args"), complete)))
        return cls(list(map(attrgetter("cat"), complete)), names, ts, dur, tid, args)


def _usable_only(path: Path, columns: _Columns, checks: Checks) -> _Columns:
    """`columns` without what the analysis cannot use (`_usable`), with the same columns in the same order; a
    one-line error where nothing is left."""
    keep = _usable(columns.cats, columns.names, columns.ts, columns.dur, columns.tid, checks)
    if keep is not None:
        columns = _Columns(list(compress(columns.cats, keep)), columns.names[keep], columns.ts[keep],
                           columns.dur[keep], columns.tid[keep], columns.args[keep])
    if not columns.cats:
        raise LabError(f"{path}: no usable complete ('X') event: "
                       + ("; ".join(checks.lines()) or "the trace holds none") + ".")
    return columns


def _by_category(columns: _Columns) -> dict[str, Events]:
    """The columns split by category, in the order of each category's first appearance, each with the fields its
    analyzers read."""
    args = columns.args
    n = len(columns.cats)

    def field(name: str, missing: int, chosen: np.ndarray) -> np.ndarray:
        return _ints(list(map(attrgetter(name), chosen.tolist())), missing)

    codes = {c: k for k, c in enumerate(dict.fromkeys(columns.cats))}  # in the order of first appearance
    cat_code = np.fromiter(map(codes.__getitem__, columns.cats), np.int64, n)
    # launch correlation, stream and bytes are read from every event but the Python functions' (nine in ten events of
    # a trace with stacks): a Python function event carries none of them, and the analyzers read none of its
    corr_all, stream_all, bytes_all = np.full(n, -1), np.full(n, -1), np.zeros(n, dtype=np.int64)
    external_all = np.full(n, -1)
    others = np.flatnonzero(cat_code != codes.get("python_function", -1))
    if len(others):
        corr_all[others] = field("correlation", -1, args[others])
        stream_all[others] = field("stream", -1, args[others])
        bytes_all[others] = field("bytes", 0, args[others])
        external_all[others] = field("external_id", -1, args[others])
    order = np.argsort(cat_code, kind="stable")
    bounds = np.searchsorted(cat_code[order], np.arange(len(codes) + 1))
    by_cat = {}
    for cat, code in codes.items():
        idx = order[bounds[code]:bounds[code + 1]]
        extra = {"stream": stream_all[idx], "bytes": bytes_all[idx], "external": external_all[idx]}
        if cat == "cpu_op":  # the operators' arguments, where the trace recorded shapes (None where it did not)
            chosen = args[idx].tolist()
            for key, attr in (("dims", "input_dims"), ("strides", "input_strides"), ("types", "input_type"),
                              ("concrete", "concrete")):
                extra[key] = _objects(list(map(attrgetter(attr), chosen)))
        if cat == "python_function":
            extra["pyid"] = field("python_id", -1, args[idx])
            extra["pyparent"] = field("python_parent", -1, args[idx])
        by_cat[cat] = Events(columns.names[idx].tolist(), columns.ts[idx], columns.dur[idx], columns.tid[idx],
                             corr_all[idx], extra)
    return by_cat


def _main_thread(cpu_ops: Events | None) -> int:
    """The first thread with the most CPU operators, as counting them in event order picks it (0 without any)."""
    if cpu_ops is None or not len(cpu_ops):
        return 0
    tids, counts = np.unique(cpu_ops.tid, return_counts=True)
    first = {t: k for k, t in reversed(list(enumerate(cpu_ops.tid.tolist())))}
    best = max(counts)
    return min((int(t) for t, c in zip(tids, counts) if c == best), key=lambda t: first[t])


def _exact_starts(data: bytes) -> list[int]:
    """Every event's start in integer nanoseconds, read from the digits the file holds (a decimal, not a float: past
    `EXACT_FROM_US` a float would round distinct starts together). Only for such traces: a Python step per event."""
    return [int((Decimal(bytes(e.ts).decode()) * 1000).to_integral_value())
            for e in msgspec.json.decode(data, type=_Starts).traceEvents]


def _usable(cats: list[str], names: np.ndarray, ts: np.ndarray, dur: np.ndarray, tid: np.ndarray,
            checks: Checks) -> np.ndarray | None:
    """Which complete events the analysis can use (a mask), or None when all can; what it leaves out, and why, goes
    into `checks`. Vectorised: it is one of the passes over every event of a large trace."""
    n = len(ts)
    if n == 0:
        return None
    bad = np.zeros(n, dtype=bool)

    def drop(mask: np.ndarray, why: str) -> None:
        new = mask & ~bad
        if new.any():
            checks.dropped[why] = int(new.sum())
            bad[:] |= new

    drop(ts < 0, "a negative start time")
    drop(dur < 0, "a negative duration")
    rest = ts[~bad]
    if len(rest):
        middle = int(np.median(rest))
        drop(np.abs(ts - middle) > SPAN_NS,
             "a start a day or more from the rest of the trace (a wrapped or mixed clock)")
    checks.zero_length = int(((dur == 0) & ~bad).sum())
    # exact duplicates (the same category, name, thread, start and duration), looked for among the events that share
    # a start with another (nanosecond starts rarely coincide, so few events are looked at)
    by_ts = np.argsort(ts, kind="stable")
    shared = ts[by_ts][1:] == ts[by_ts][:-1]
    if shared.any():
        maybe = np.unique(np.concatenate([by_ts[1:][shared], by_ts[:-1][shared]]))
        code = np.fromiter((hash((cats[i], names[i])) for i in maybe.tolist()), np.int64, len(maybe))
        rows = np.stack([code, tid[maybe], ts[maybe], dur[maybe]], axis=1)
        order = np.lexsort(rows.T[::-1])
        same = np.zeros(n, dtype=bool)
        same[maybe[order[1:]]] = np.all(rows[order[1:]] == rows[order[:-1]], axis=1)
        drop(same, "an exact duplicate of another event")
    return ~bad if bad.any() else None

"""The timeline toolbox shared by the trace analyzers: integer-nanosecond intervals and their unions, the
`denoise_step_<i>` spans, the innermost user-code Python frame at a point in time, and the names of the CUDA calls
that sync or launch. Nothing here analyses a trace; `analysis`, `gaps` and `compiled` build on it."""

from __future__ import annotations

import re
from itertools import compress

import numpy as np

from lab.base.marks import LOOP_BEGIN, STEP_PREFIX
from lab.base.paths import lab_wrapper_paths
from lab.traces.trace import Trace

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cudaMemcpy3D")
RUNTIME_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaMemcpyAsync",
                    "cudaMemsetAsync", "cudaGraphLaunch")
DRIVER_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch")
STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")
def lab_wrapper_pattern() -> str:
    """A regex alternative that matches a frame of one of the lab's wrappers."""
    return "|".join("(?:^|/)" + re.escape(p) for p in lab_wrapper_paths())


# Frames that are not "user code" when attributing a sync to a Python line.
_NOT_USER = re.compile(
    r"^<built-in|^nn\.Module:|^torch/|/torch/|/contextlib\.py|/functools\.py|/threading\.py|^<frozen|/typing\.py"
    r"|/_contextlib\.py|" + lab_wrapper_pattern()
)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def us(ns: float | int | np.integer) -> float:
    return float(ns) / 1000.0


# --- helpers -------------------------------------------------------------------------------------------------------


def union_length(starts: np.ndarray, ends: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Total length of the union of [start, end) intervals, and the merged intervals (all integer ns)."""
    if len(starts) == 0:
        return 0, starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    new_block = np.empty(len(s), dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > running_end[:-1]
    block_ids = np.cumsum(new_block) - 1
    merged_s = s[new_block]
    merged_e = np.zeros(len(merged_s), dtype=np.int64)
    np.maximum.at(merged_e, block_ids, e)
    return int((merged_e - merged_s).sum()), merged_s, merged_e


def steps(trace: Trace) -> list[tuple[int, int, int]]:
    """(step index, start ns, end ns) of the `denoise_step_<i>` annotations on the CPU timeline."""
    ann = trace.annotations
    out = []
    for name, ts, dur in zip(ann.names, ann.ts, ann.dur):
        m = STEP_RE.match(name)
        if m:
            out.append((int(m.group(1)), int(ts), int(ts + dur)))
    return sorted(out)


def loop_begin(trace: Trace, step_spans: list[tuple[int, int, int]]) -> int | None:
    """When the denoising loop began: the last `LOOP_BEGIN` mark before the first step (the pipeline opened its
    progress bar there), else the first step's start; None without steps."""
    if not step_spans:
        return None
    first = step_spans[0][1]
    ann = trace.annotations
    marks = [int(t) for n, t in zip(ann.names, ann.ts) if n == LOOP_BEGIN and t <= first]
    return max(marks) if marks else first


def loop_step_of(times: np.ndarray, step_spans: list[tuple[int, int, int]], begin: int | None) -> np.ndarray:
    """The step each time belongs to inside the loop, from `begin` to the last step's end: the step holding it, or,
    between two steps (after one step's callback, before the next step's transformer call), the step that follows;
    -1 outside the loop."""
    out = step_of(times, step_spans)
    if begin is None:
        return out
    starts = np.array([s for _, s, _ in step_spans], dtype=np.int64)
    index = np.array([i for i, _, _ in step_spans], dtype=np.int64)
    between = (out < 0) & (times >= begin) & (times < step_spans[-1][2])
    out[between] = index[np.searchsorted(starts, times[between], side="right").clip(max=len(starts) - 1)]
    return out


def step_of(times: np.ndarray, step_spans: list[tuple[int, int, int]]) -> np.ndarray:
    """The step index containing each time, or -1."""
    out = np.full(len(times), -1, dtype=np.int64)
    for i, start, end in step_spans:
        out[(times >= start) & (times < end)] = i
    return out


def per_step(indices: np.ndarray, values: np.ndarray | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in np.unique(indices):
        key = str(int(i)) if i >= 0 else "outside"
        sel = indices == i
        out[key] = float(values[sel].sum()) if values is not None else int(sel.sum())
    return out


_BLOCK = 1024


class Frames:
    """Innermost Python frames at a point in time on one thread (from `with_stack` python_function events)."""

    def __init__(self, trace: Trace) -> None:
        py = trace.cat("python_function")
        main = py.tid == trace.main_tid
        self.names = list(compress(py.names, main.tolist()))
        self.ts = py.ts[main]
        self.end = py.end[main]
        # a lookup reads only the frames started by `t`, in blocks of the start order, and of those only the blocks
        # holding a frame still open at `t` (the latest end in each block says which): a few blocks, not the trace
        self._order = np.argsort(self.ts, kind="stable")
        self._starts = self.ts[self._order]
        self._ends = self.end[self._order]
        whole = len(self._ends) // _BLOCK * _BLOCK
        self._latest = self._ends[:whole].reshape(-1, _BLOCK).max(axis=1)

    def __bool__(self) -> bool:
        return len(self.names) > 0

    def stack_at(self, t: int) -> list[str]:
        """Frames enclosing time `t`, innermost first (the later start first; frames of one start in trace order)."""
        started = int(np.searchsorted(self._starts, t, side="right"))
        full = min(started // _BLOCK, len(self._latest))
        spans = [(b * _BLOCK, b * _BLOCK + _BLOCK) for b in np.flatnonzero(self._latest[:full] > t).tolist()]
        spans.append((full * _BLOCK, started))
        hits = np.sort(np.concatenate([self._order[a:b][self._ends[a:b] > t] for a, b in spans]))
        hits = hits[np.argsort(-self.ts[hits], kind="stable")]
        return [self.names[i] for i in hits.tolist()]

    def user_frame(self, t: int) -> str | None:
        """The innermost frame of user code (not torch, builtins or the lab's own wrappers) enclosing `t`."""
        for name in self.stack_at(t):
            if not _NOT_USER.search(name):
                return short_frame(name)
        return None


def short_frame(name: str) -> str:
    """`/abs/site-packages/diffusers/x.py(12): f` -> `diffusers/x.py:12 f`."""
    m = re.match(r"^(.*)\((\d+)\): (.*)$", name)
    if not m:
        return name
    path, line, func = m.groups()
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{line} {func}"


def normalize_name(name: str) -> str:
    """Drop run-specific noise (object addresses) so names compare across traces."""
    return _ADDRESS.sub("0x…", name)

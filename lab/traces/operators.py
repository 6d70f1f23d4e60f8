"""A trace's CPU operators as a forest (`Ops`: each operator's parent, the index by the `External id` its kernels
carry) and the user-code line that called an operator (`site`)."""

from __future__ import annotations

import numpy as np

from lab.traces.timeline import Frames
from lab.traces.trace import Trace


class Ops:
    """The trace's CPU operators as a forest: for each operator its parent (the innermost operator enclosing it on
    its thread), and the index by `External id` that kernels carry."""

    def __init__(self, trace: Trace) -> None:
        ops = trace.cat("cpu_op")
        self.ops = ops
        n = len(ops)
        self.parent = np.full(n, -1, dtype=np.int64)
        order = np.lexsort((-ops.dur, ops.ts, ops.tid))
        stack: list[int] = []
        last_tid = None
        ts, end, tid = ops.ts.tolist(), ops.end.tolist(), ops.tid.tolist()
        parent = self.parent
        for i in order.tolist():
            if tid[i] != last_tid:
                stack, last_tid = [], tid[i]
            while stack and end[stack[-1]] <= ts[i]:
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
        external = ops.extra.get("external", np.full(n, -1))
        self.by_external = {e: i for i, e in enumerate(external.tolist()) if e >= 0}
        self._chains: dict[int, list[str]] = {}

    def chain(self, i: int, depth: int = 8) -> list[str]:
        """Operator names from `i` outwards."""
        found = self._chains.get(i)
        if found is None:
            found, j = [], i
            while j >= 0 and len(found) < depth:
                found.append(self.ops.names[j])
                j = int(self.parent[j])
            self._chains[i] = found
        return found

    def ancestors(self, i: int) -> list[int]:
        out, j = [], int(self.parent[i])
        while j >= 0:
            out.append(j)
            j = int(self.parent[j])
        return out

    def self_time(self) -> np.ndarray:
        """Each operator's time less its children's (ns)."""
        own = self.ops.dur.astype(np.int64).copy()
        has = self.parent >= 0
        np.subtract.at(own, self.parent[has], self.ops.dur[has])
        return np.maximum(own, 0)


def site(frames: Frames | None, ops: Ops, i: int, cache: dict[int, str]) -> str:
    """The user-code line that called operator `i` (looked up at the outermost operator's start)."""
    root = i
    j = int(ops.parent[i])
    while j >= 0:
        root, j = j, int(ops.parent[j])
    found = cache.get(root)
    if found is None:
        found = (frames.user_frame(int(ops.ops.ts[root])) if frames else None) or "(no Python stack)"
        cache[root] = found
    return found

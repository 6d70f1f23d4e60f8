"""The device's work by stream: how long each stream's kernels, copies and sets keep it busy.

Work on one stream runs one item after another, whatever the host does, so a stream's busy time is the sum of its
items' device times (their union, to be exact where the profiler records overlapping items). Across streams it is
otherwise: how much two streams overlap depends on when the host issued their work, and a profiled host issues it
later than a plain one. The busiest stream's time is therefore what a call's GPU work takes at the least, profiled or
not: the floor that `lab.verdicts.bound` holds a call's time against.
"""

from __future__ import annotations

import numpy as np

from lab.traces.timeline import union_length, us
from lab.traces.trace import GPU_CATS, Trace


def stream_analysis(trace: Trace) -> dict:
    """Each stream's busy time (µs, the union of its items' intervals) and item count, the busiest stream's busy
    time (`busiest_us`), and the busy time of all streams together (`union_us`)."""
    if not trace.has_gpu:
        return {"missing": "no GPU activity in this trace (CPU-only profile)"}
    parts = [trace.cat(c) for c in GPU_CATS]
    ts = np.concatenate([p.ts for p in parts])
    end = np.concatenate([p.end for p in parts])
    stream = np.concatenate([p.extra.get("stream", np.full(len(p), -1)) for p in parts])
    by_stream = {}
    for s in np.unique(stream):
        sel = stream == s
        busy, _, _ = union_length(ts[sel], end[sel])
        by_stream[str(int(s))] = {"busy_us": us(busy), "items": int(sel.sum())}
    union, _, _ = union_length(ts, end)
    busiest = max(by_stream.values(), key=lambda v: v["busy_us"])
    return {"streams": by_stream, "busiest_us": busiest["busy_us"], "union_us": us(union)}

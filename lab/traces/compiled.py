"""What a torch.profiler trace says about torch.compile: compiled frames and recompiles, guard evaluation (dynamo's
cache lookup before every compiled call), and the launches and GPU time inside compiled regions versus the eager
code around them.

A compiled call shows in the trace as a `Torch-Compiled Region: F/C` span (F the compiled frame, C its compile id:
C > 0 means the frame was compiled again after a guard failed), preceded by a `TorchDynamo Cache Lookup` span (the
guards) and holding `## Call CompiledFxGraph <hash> ##` (one Inductor graph). A kernel launch (runtime or driver
API) whose time lies inside no compiled region on its thread came from eager code: an uncompiled module, the
scheduler, or an island a graph break left.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from lab.traces.timeline import DRIVER_LAUNCHES, RUNTIME_LAUNCHES, Frames, steps, union_length, us
from lab.traces.trace import Trace

REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)$")
LOOKUP = "TorchDynamo Cache Lookup"
GRAPH = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")


def _spans(trace: Trace, label: str) -> list[tuple[int, int]]:
    ann = trace.annotations
    return sorted((int(t), int(t + d)) for n, t, d in zip(ann.names, ann.ts, ann.dur) if n == label)


def _inside(times: np.ndarray, tids: np.ndarray, starts: np.ndarray, ends: np.ndarray, span_tids: np.ndarray) -> np.ndarray:
    """Whether each (time, thread) lies inside one of the spans of the same thread."""
    out = np.zeros(len(times), dtype=bool)
    for tid in np.unique(span_tids):
        _, s, e = union_length(starts[span_tids == tid], ends[span_tids == tid])
        sel = tids == tid
        t = times[sel]
        i = np.searchsorted(s, t, side="right") - 1
        out[np.flatnonzero(sel)] = (i >= 0) & (t < e[np.clip(i, 0, None)])
    return out


def _launches(trace: Trace):
    rt = trace.cat("cuda_runtime").named(*RUNTIME_LAUNCHES)
    dr = trace.cat("cuda_driver").named(*DRIVER_LAUNCHES)
    return (np.concatenate([rt.ts, dr.ts]), np.concatenate([rt.tid, dr.tid]),
            np.concatenate([rt.correlation, dr.correlation]))


def _kernel_time(trace: Trace) -> dict[int, int]:
    """GPU time (ns) of the kernels, memcpys and memsets each launch correlation id started."""
    gpu = trace.gpu
    out: dict[int, int] = {}
    for c, d in zip(gpu.correlation.tolist(), gpu.dur.tolist()):
        out[c] = out.get(c, 0) + d
    return out


def _started_in(trace: Trace, spans: list[tuple[int, int]]) -> float | None:
    """GPU work items (kernels, memcpys, memsets) launched inside each span, on average; None without spans."""
    if not spans:
        return None
    times, _, corr = _launches(trace)
    started = set(trace.gpu.correlation.tolist())
    hits = 0
    for s, e in spans:
        sel = (times >= s) & (times < e)
        hits += sum(1 for c in corr[sel].tolist() if c in started)
    return hits / len(spans)


def kernels_per(trace: Trace, label: str) -> float | None:
    """GPU work launched per `label` span (e.g. per `transformer_forward`), on average."""
    return _started_in(trace, _spans(trace, label))


def kernels_per_step(trace: Trace) -> float | None:
    """GPU work launched per denoising step, on average."""
    return _started_in(trace, [(s, e) for _, s, e in steps(trace)])


def compile_analysis(trace: Trace, frames: Frames | None = None, top: int = 8) -> dict:
    """The compile section of `lab analyze`: see the module docstring. On a trace without compiled regions it says
    so and gives the kernels per transformer call and per step, the eager side of a comparison."""
    ops = trace.cat("cpu_op")
    per_call = _spans(trace, "pipeline_call")
    calls = max(1, len(per_call))
    spans = steps(trace)
    out: dict = {"kernels_per_transformer_call": kernels_per(trace, "transformer_forward"),
                 "kernels_per_step": kernels_per_step(trace), "pipeline_calls": calls}
    regions = [(int(m.group(1)), int(m.group(2)), int(t), int(t + d), int(tid))
               for n, t, d, tid in zip(ops.names, ops.ts, ops.dur, ops.tid) if (m := REGION.match(n))]
    if not regions:
        out["compiled"] = False
        out["note"] = "no compiled regions in this trace: it ran eagerly (or was captured without CPU activity)"
        return out
    out["compiled"] = True
    by_frame: dict[int, dict] = {}
    for frame, cid, *_ in regions:
        f = by_frame.setdefault(frame, {"calls": 0, "compile_ids": Counter()})
        f["calls"] += 1
        f["compile_ids"][cid] += 1
    out["frames"] = {str(k): {"calls": v["calls"], "calls_per_pipeline_call": v["calls"] / calls,
                              "calls_per_step": v["calls"] / len(spans) if spans else None,
                              "compile_ids": {str(c): n for c, n in sorted(v["compile_ids"].items())}}
                     for k, v in sorted(by_frame.items())}
    out["recompiled"] = [{"frame": k, "compile_id": c, "calls": n} for k, v in sorted(by_frame.items())
                         for c, n in sorted(v["compile_ids"].items()) if c > 0]
    graphs = Counter(m.group(1) for n in ops.names if (m := GRAPH.match(n)))
    out["graphs"] = {"distinct": len(graphs), "calls": sum(graphs.values())}
    lookups = ops.named(LOOKUP)
    durs = lookups.dur / 1000.0
    out["guards"] = {"lookups": len(lookups), "total_us": float(durs.sum()),
                     "per_pipeline_call_us": float(durs.sum()) / calls,
                     "per_step_us": float(durs.sum()) / len(spans) if spans else None,
                     "median_us": float(np.median(durs)) if len(durs) else None,
                     "max_us": float(durs.max()) if len(durs) else None}
    # launches and GPU time inside compiled regions versus outside them
    times, tids, corr = _launches(trace)
    starts = np.array([r[2] for r in regions], dtype=np.int64)
    ends = np.array([r[3] for r in regions], dtype=np.int64)
    rtids = np.array([r[4] for r in regions], dtype=np.int64)
    inside = _inside(times, tids, starts, ends, rtids)
    gpu_ns = _kernel_time(trace)
    t_in = sum(gpu_ns.get(c, 0) for c in corr[inside].tolist())
    t_out = sum(gpu_ns.get(c, 0) for c in corr[~inside].tolist())
    out["launches"] = {"inside": int(inside.sum()), "outside": int((~inside).sum()),
                       "outside_share": float((~inside).mean()) if len(inside) else 0.0,
                       "gpu_us_inside": us(t_in), "gpu_us_outside": us(t_out)}
    frames = frames if frames is not None else Frames(trace)
    if frames:
        sites: dict[str, dict] = {}
        for t, c in zip(times[~inside].tolist(), corr[~inside].tolist()):
            site = frames.user_frame(int(t)) or "(no user frame)"
            entry = sites.setdefault(site, {"launches": 0, "gpu_us": 0.0})
            entry["launches"] += 1
            entry["gpu_us"] += us(gpu_ns.get(c, 0))
        out["outside_sites"] = dict(sorted(sites.items(), key=lambda kv: -kv[1]["launches"])[:top])
    else:
        out["outside_sites"] = {"missing": "no Python stacks: profile with --with-stack to see where eager launches come from"}
    return out


def fusion(eager: dict, compiled: dict) -> dict:
    """Kernels per transformer call and per step side by side, and the fusion ratio (eager / compiled)."""
    out = {}
    for key in ("kernels_per_transformer_call", "kernels_per_step"):
        a, b = eager.get(key), compiled.get(key)
        out[key] = {"eager": a, "compiled": b, "ratio": (a / b) if a and b else None}
    return out

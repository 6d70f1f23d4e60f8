"""Analyzers over a parsed trace: syncs, host scalar reads, GPU busy/idle, CPU gaps, launches, memory, regions.

Each analyzer is a pure function `(trace, ...) -> dict` of plain numbers (JSON-ready; times in microseconds as
floats computed from integer nanoseconds). :func:`analyze` runs them all; :func:`compare` puts two side by side.
Analyses that need data the trace lacks return `{"missing": "<what, and how to capture it>"}`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from lab.traces.checklist import checklist
from lab.traces.compiled import compile_analysis, fusion
from lab.traces.gaps import attribute, moved
from lab.traces.timeline import (
    DRIVER_LAUNCHES,
    RUNTIME_LAUNCHES,
    STEP_RE,
    SYNC_CALLS,
    Frames,
    normalize_name,
    per_step,
    step_of,
    steps,
    union_length,
    us,
)
from lab.traces.streams import stream_analysis
from lab.traces.trace import Trace
from lab.traces.transfers import transfer_analysis
from lab.traces.work import LAYOUT, summary, work_analysis

GAP_BUCKETS_US = (10, 100, 1000)

__all__ = ["DRIVER_LAUNCHES", "RUNTIME_LAUNCHES", "SYNC_CALLS", "analyze", "compare", "headline", "name_counts"]

# --- analyzers -----------------------------------------------------------------------------------------------------


def sync_analysis(trace: Trace, frames: Frames | None = None) -> dict:
    """Host-blocking syncs: count and blocked time by call, per step, and by Python call site."""
    rt = trace.cat("cuda_runtime").named(*SYNC_CALLS)
    spans = steps(trace)
    frames = frames if frames is not None else Frames(trace)
    by_call = Counter(rt.names)
    blocked = {name: us(rt.dur[[i for i, n in enumerate(rt.names) if n == name]].sum()) for name in by_call}
    sites: dict[str, dict[str, float]] = {}
    for name, ts, dur in zip(rt.names, rt.ts, rt.dur):
        site = (frames.user_frame(int(ts)) if frames else None) or "(no Python stack: profile with --with-stack)"
        entry = sites.setdefault(site, {"count": 0, "blocked_us": 0.0, "calls": {}})
        entry["count"] += 1
        entry["blocked_us"] += us(dur)
        entry["calls"][name] = entry["calls"].get(name, 0) + 1
    step_idx = step_of(rt.ts, spans)
    return {
        "count": len(rt),
        "blocked_us": us(rt.dur.sum()),
        "by_call": {n: {"count": c, "blocked_us": blocked[n]} for n, c in by_call.most_common()},
        "per_step": per_step(step_idx) if spans else None,
        "blocked_us_per_step": per_step(step_idx, rt.dur / 1000.0) if spans else None,
        "sites": dict(sorted(sites.items(), key=lambda kv: -kv[1]["blocked_us"])),
    }


def host_reads_analysis(trace: Trace, frames: Frames | None = None) -> dict:
    """Host scalar reads (`aten::_local_scalar_dense`), `aten::nonzero`, and memcpys by direction."""
    ops = trace.cat("cpu_op")
    spans = steps(trace)
    reads = ops.named("aten::_local_scalar_dense")
    nonzero = ops.named("aten::nonzero")
    frames = frames if frames is not None else Frames(trace)
    read_sites = Counter((frames.user_frame(int(t)) if frames else None) or "(no Python stack)" for t in reads.ts)
    memcpy = trace.cat("gpu_memcpy")
    directions: dict[str, dict[str, float]] = {}
    for name, nbytes in zip(memcpy.names, memcpy.extra.get("bytes", np.zeros(len(memcpy), dtype=np.int64))):
        m = re.search(r"Memcpy (\w+)", name)
        key = m.group(1) if m else name
        d = directions.setdefault(key, {"count": 0, "bytes": 0})
        d["count"] += 1
        d["bytes"] += int(nbytes)
    return {
        "scalar_reads": len(reads),
        "scalar_reads_per_step": per_step(step_of(reads.ts, spans)) if spans else None,
        "scalar_read_sites": dict(read_sites.most_common()),
        "nonzero": len(nonzero),
        "memcpy": directions,
    }


def gpu_idle_analysis(trace: Trace, threshold_us: float = 100.0, frames: Frames | None = None) -> dict:
    """GPU busy and idle: union of kernel/memcpy/memset intervals over all streams, exact in ns.

    Over the whole trace (first GPU start to last GPU end) and over the denoising window (first step start to last
    step end, on the CPU timeline). Idle gaps are counted by size; gaps over `threshold_us` are listed with what the
    CPU was doing: a sync call overlapping the gap, else the innermost user-code Python frame at the gap's start.
    """
    if not trace.has_gpu:
        return {"missing": "no GPU activity in this trace (CPU-only profile): profile on CUDA with the CUDA activity"}
    gpu = trace.gpu
    starts, ends = gpu.ts, gpu.end
    busy, ms, me = union_length(starts, ends)
    span_start, span_end = int(ms[0]), int(me.max())
    gaps_s, gaps_e = me[:-1], ms[1:]
    gap_len = gaps_e - gaps_s

    def window(lo: int, hi: int) -> dict:
        s, e = np.clip(ms, lo, hi), np.clip(me, lo, hi)
        b = int((e - s).sum())
        return {"span_us": us(hi - lo), "busy_us": us(b), "idle_us": us(hi - lo - b),
                "idle_pct": 100.0 * (hi - lo - b) / (hi - lo) if hi > lo else 0.0}

    out = {"whole": window(span_start, span_end)}
    spans = steps(trace)
    out["denoise"] = window(spans[0][1], spans[-1][2]) if spans else None
    if spans:  # idle gaps inside the denoising window (the checklist's "GPU staying busy")
        inside = (gaps_s >= spans[0][1]) & (gaps_e <= spans[-1][2])
        out["denoise_gaps_over_100us"] = int((inside & (gap_len > 100_000)).sum())
    out["gaps_over_us"] = {str(b): int((gap_len > b * 1000).sum()) for b in GAP_BUCKETS_US}
    syncs = trace.cat("cuda_runtime").named(*SYNC_CALLS)
    frames = frames if frames is not None else Frames(trace)
    listed = []
    for i in np.flatnonzero(gap_len > threshold_us * 1000):
        g0, g1 = int(gaps_s[i]), int(gaps_e[i])
        overlapping = np.flatnonzero((syncs.ts < g1) & (syncs.end > g0))
        if len(overlapping):
            j = overlapping[0]
            where = frames.user_frame(int(syncs.ts[j])) if frames else None
            cause = f"sync {syncs.names[j]}" + (f" at {where}" if where else "")
        else:
            where = frames.user_frame(g0) if frames else None
            cause = f"CPU in {where}" if where else "CPU (no Python stack)"
        listed.append({"start_us": us(g0 - span_start), "length_us": us(g1 - g0), "cause": cause})
    out["gaps"] = sorted(listed, key=lambda g: -g["length_us"])
    out["threshold_us"] = threshold_us
    return out


def region_analysis(trace: Trace, regions: Sequence[str] = (), functions: Sequence[str] = ()) -> dict:
    """Totals and counts of annotated regions and of named Python functions (`file.py:func`)."""
    ann = trace.annotations
    out: dict[str, dict] = {"regions": {}, "functions": {}}
    names = set(regions) or {n for n in ann.names if not STEP_RE.match(n)}
    for name in sorted(names):
        sel = np.fromiter((n == name for n in ann.names), bool, len(ann))
        out["regions"][name] = {"count": int(sel.sum()), "total_us": us(ann.dur[sel].sum())}
    py = trace.cat("python_function")
    for spec in functions:
        file, _, func = spec.rpartition(":")
        pattern = re.compile(rf"{re.escape(file)}\(\d+\): {re.escape(func)}$" if file else rf"\(\d+\): {re.escape(func)}$")
        sel = np.fromiter((bool(pattern.search(n)) for n in py.names), bool, len(py))
        idx = np.flatnonzero(sel)
        # count every call, but sum only outermost ones so recursion is not double counted
        total, last_end = 0, -1
        for i in idx[np.argsort(py.ts[idx], kind="stable")]:
            if py.ts[i] >= last_end:
                total += int(py.dur[i])
                last_end = int(py.end[i])
        out["functions"][spec] = {"count": int(len(idx)), "total_us": us(total)}
        if not py.names:
            out["functions"][spec]["missing"] = "no Python stacks: profile with --with-stack"
    return out


def cpu_gap_analysis(trace: Trace, label: str = "transformer_forward") -> dict:
    """CPU gaps between consecutive `label` spans (the upstream guide's "CPU gaps" row). A span that starts before
    the spans so far have ended (nested, or on another thread) leaves no gap: it is counted in `overlaps` (and how far
    it reached back, `overlap_us`) and said in `warnings`, never a negative gap."""
    ann = trace.annotations
    sel = np.fromiter((n == label for n in ann.names), bool, len(ann))
    if not sel.any():
        return {"missing": f"no `{label}` annotations: profile with `lab profile` (or the upstream harness)"}
    ts, end = ann.ts[sel], ann.end[sel]
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    between = ts[1:] - np.maximum.accumulate(end)[:-1]  # from the end of every span so far to the next start
    overlapping = between < 0
    gaps = between[~overlapping] / 1000.0
    out = {"count": int(len(gaps)), "total_us": float(gaps.sum()), "gaps_us": [float(g) for g in gaps],
           "max_us": float(gaps.max()) if len(gaps) else 0.0}
    if overlapping.any():
        reach = float(-between[overlapping].min()) / 1000.0
        out.update(overlaps=int(overlapping.sum()), overlap_us=float(-between[overlapping].sum()) / 1000.0,
                   warnings=[f"{int(overlapping.sum())} `{label}` span(s) start before the one before ended (by up to "
                             f"{reach / 1000:,.3f} ms: nested or concurrent annotations); no CPU gap is counted there"])
    return out


def launch_analysis(trace: Trace) -> dict:
    """Launches (runtime and driver API) per step; launch-to-start latency and queue depth."""
    rt = trace.cat("cuda_runtime").named(*RUNTIME_LAUNCHES)
    dr = trace.cat("cuda_driver").named(*DRIVER_LAUNCHES)
    spans = steps(trace)
    out = {
        "runtime": dict(Counter(rt.names).most_common()),
        "driver": dict(Counter(dr.names).most_common()),
        "total": len(rt) + len(dr),
    }
    launch_ts = np.concatenate([rt.ts, dr.ts])
    if spans:
        out["per_step"] = per_step(step_of(launch_ts, spans))
    if not trace.has_gpu:
        return out
    gpu = trace.gpu
    corr = np.concatenate([rt.correlation, dr.correlation])
    gpu_start = dict(zip(gpu.correlation.tolist(), gpu.ts.tolist()))
    pairs = [(int(t), gpu_start[c]) for t, c in zip(launch_ts, corr.tolist()) if c in gpu_start]
    if not pairs:
        return out
    launched = np.array(sorted(p[0] for p in pairs), dtype=np.int64)
    started = np.array(sorted(p[1] for p in pairs), dtype=np.int64)
    latency = np.array([g - s for s, g in pairs], dtype=np.int64) / 1000.0
    depth = np.searchsorted(launched, launched, side="right") - np.searchsorted(started, launched, side="right")
    out["latency_us"] = {"median": float(np.median(latency)), "p90": float(np.percentile(latency, 90)),
                         "max": float(latency.max())}
    out["queue_depth"] = {"median": float(np.median(depth)), "max": int(depth.max())}
    out["cpu_runs_ahead"] = bool(np.median(depth) > 8)
    return out


def memory_analysis(trace: Trace) -> dict:
    """Allocated GPU memory per step (from `profile_memory` events); growth across steps is flagged."""
    mem = trace.memory
    if len(mem) == 0:
        return {"missing": "no memory events: profile with --profile-memory"}
    gpu = mem[mem[:, 1] >= 0]
    if len(gpu) == 0:
        return {"missing": "no GPU memory events in this trace"}
    spans = steps(trace)
    out = {"peak_bytes": int(gpu[:, 2].max())}
    if spans:
        per = {}
        for i, start, end in spans:
            sel = gpu[(gpu[:, 0] >= start) & (gpu[:, 0] < end)]
            if len(sel):
                per[str(i)] = int(sel[:, 2].max())
        out["peak_bytes_per_step"] = per
        values = list(per.values())
        out["grows_across_steps"] = bool(len(values) >= 3 and all(b > a for a, b in zip(values, values[1:])))
    return out


def name_counts(trace: Trace) -> Counter:
    """Event counts by normalized name (CPU ops, runtime/driver calls, kernels, annotations)."""
    counts: Counter = Counter()
    for cat in ("cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation"):
        counts.update(f"{cat}: {normalize_name(n)}" for n in trace.cat(cat).names)
    return counts


def analyze(trace: Trace, *, functions: Sequence[str] = (), gap_threshold_us: float = 100.0) -> dict:
    frames = Frames(trace)
    spans = steps(trace)
    cpu_gaps = cpu_gap_analysis(trace)
    result = {
        "trace": trace.path,
        "device": (trace.device_properties[0].get("name") if trace.device_properties else None),
        "with_stack": bool(frames),
        "steps": len(spans),
        "step_us_total": us(sum(e - s for _, s, e in spans)) if spans else None,
        "syncs": sync_analysis(trace, frames),
        "host_reads": host_reads_analysis(trace, frames),
        "gpu": gpu_idle_analysis(trace, gap_threshold_us, frames),
        "streams": stream_analysis(trace),
        "transfers": transfer_analysis(trace),
        "cpu_gaps": cpu_gaps,
        "launches": launch_analysis(trace),
        "memory": memory_analysis(trace),
        "regions": region_analysis(trace, functions=functions),
        "compile": compile_analysis(trace, frames),
        "gaps": attribute(trace, gap_threshold_us),
        "work": work_analysis(trace, frames),
        "trace_checks": trace.checks.lines() + cpu_gaps.get("warnings", []),
        "notes": ([] if spans else ["no denoise_step annotations: per-step figures need `lab profile`"])
        + ([] if frames else ["no Python stacks: sync sites need --with-stack"]),
    }
    result["checklist"] = checklist(result)
    return result


# --- comparing two traces ---------------------------------------------------------------------------------------


def headline(result: dict) -> dict[str, float | None]:
    """The metrics shown side by side for two traces (and in the A/B tables)."""
    gpu, gaps = result["gpu"], result["cpu_gaps"]
    steps_n = result["steps"] or None

    def over_steps(value):
        return value / steps_n if (steps_n and value is not None) else None

    return {
        "syncs": result["syncs"]["count"],
        "syncs_per_step": over_steps(sum(v for k, v in (result["syncs"]["per_step"] or {}).items() if k != "outside"))
        if result["syncs"]["per_step"] is not None else None,
        "sync_blocked_us": result["syncs"]["blocked_us"],
        "host_scalar_reads": result["host_reads"]["scalar_reads"],
        "nonzero": result["host_reads"]["nonzero"],
        "memcpy_HtoD": result["host_reads"]["memcpy"].get("HtoD", {}).get("count", 0),
        "memcpy_DtoH": result["host_reads"]["memcpy"].get("DtoH", {}).get("count", 0),
        "gpu_idle_us": None if "missing" in gpu else gpu["whole"]["idle_us"],
        "gpu_idle_denoise_us": None if "missing" in gpu or gpu["denoise"] is None else gpu["denoise"]["idle_us"],
        "gpu_busy_us": None if "missing" in gpu else gpu["whole"]["busy_us"],
        # the busiest stream's device time: what the call's GPU work takes at the least (`lab.verdicts.bound`)
        "gpu_stream_busy_us": (result.get("streams") or {}).get("busiest_us"),
        "copied_HtoD_bytes": (result.get("transfers") or {}).get("HtoD", {}).get("bytes"),
        "copied_DtoH_bytes": (result.get("transfers") or {}).get("DtoH", {}).get("bytes"),
        "cpu_gaps_total_us": None if "missing" in gaps else gaps["total_us"],
        "launches": result["launches"]["total"],
        "launches_per_step": over_steps(sum(v for k, v in result["launches"].get("per_step", {}).items() if k != "outside"))
        if result["launches"].get("per_step") else None,
        **work_headline(result.get("work") or {}),
    }


def work_headline(work: dict) -> dict[str, float | None]:
    """The device work's headline: its time per step (per call without steps), the layout copies' share of it, the
    strided inputs per step, and the model FLOP utilisation."""
    if not work or "missing" in work:
        return {"device_work_us": None, "layout_copy_us": None, "strided_inputs": None, "mfu_pct": None}
    brief = summary(work)
    strided = brief["strided_inputs"]
    roof = brief["roofline"]
    return {"device_work_us": sum(v["us"] for v in brief["by_class"].values()),
            "layout_copy_us": brief["by_class"].get(LAYOUT, {}).get("us", 0.0),
            "strided_inputs": None if "missing" in strided else (strided["per_step"] if strided["per_step"] is not None
                                                                  else strided["count"]),
            "mfu_pct": None if "missing" in roof else roof["mfu_pct"]}


def unlike(a: dict, b: dict) -> list[str]:
    """Why two analyses (`analyze`) do not compare as one change: other devices, or one compiled and one eager."""
    out = []
    device_a, device_b = a["device"] or "the CPU alone", b["device"] or "the CPU alone"
    if device_a != device_b:
        out.append(f"the traces come from different devices (control: {device_a}, test: {device_b}): every delta "
                   "holds the difference of the devices, not only of the code")
    compiled_a, compiled_b = a["compile"]["compiled"], b["compile"]["compiled"]
    if compiled_a != compiled_b:
        mode = {True: "compiled", False: "eager"}
        out.append(f"control is {mode[bool(compiled_a)]}, test {mode[bool(compiled_b)]}: every delta holds what "
                   "compiling changes")
    return out


def compare(control: Trace, test: Trace, **kwargs) -> dict:
    """Two traces side by side: each one's analysis, the headline metrics with their deltas, what changed, and
    `warnings`: why they may not compare (`unlike`) and what is wrong with either (its trace checks' problems)."""
    a, b = analyze(control, **kwargs), analyze(test, **kwargs)
    ha, hb = headline(a), headline(b)
    metrics = {k: {"control": ha[k], "test": hb[k],
                   "delta": (hb[k] - ha[k]) if ha[k] is not None and hb[k] is not None else None} for k in ha}
    ca, cb = name_counts(control), name_counts(test)
    changed = {n: {"control": ca.get(n, 0), "test": cb.get(n, 0), "delta": cb.get(n, 0) - ca.get(n, 0)}
               for n in set(ca) | set(cb) if ca.get(n, 0) != cb.get(n, 0)}
    sites_a, sites_b = a["syncs"]["sites"], b["syncs"]["sites"]
    sites = {s: {"control": sites_a.get(s, {}).get("count", 0), "test": sites_b.get(s, {}).get("count", 0)}
             for s in set(sites_a) | set(sites_b)}
    reads_a, reads_b = a["host_reads"]["scalar_read_sites"], b["host_reads"]["scalar_read_sites"]
    reads = {s: {"control": reads_a.get(s, 0), "test": reads_b.get(s, 0)} for s in set(reads_a) | set(reads_b)}
    out = {"control": a, "test": b, "metrics": metrics,
           "sync_sites": dict(sorted(sites.items(), key=lambda kv: kv[1]["test"] - kv[1]["control"])),
           "read_sites": dict(sorted(reads.items(), key=lambda kv: kv[1]["test"] - kv[1]["control"])),
           "name_counts": dict(sorted(changed.items(), key=lambda kv: kv[1]["delta"])),
           "gap_functions": moved(a["gaps"], b["gaps"]),
           "warnings": unlike(a, b) + [f"{side}: {problem}" for side, trace, r in (("control", control, a), ("test", test, b))
                                       for problem in trace.checks.problems() + r["cpu_gaps"].get("warnings", [])]}
    if a["compile"]["compiled"] != b["compile"]["compiled"]:  # eager against compiled: what compiling fused
        eager, compiled = (a, b) if b["compile"]["compiled"] else (b, a)
        out["fusion"] = fusion(eager["compile"], compiled["compile"])
    return out

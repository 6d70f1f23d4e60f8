"""Where the device time goes: the work of a call by kind, its sources, its arithmetic, and the roofline; the analyzer
that puts them together (`work_analysis`) and the part of it a result keeps (`summary`).

Every GPU kernel, copy and set is put in one class (:data:`CLASSES`) from its own name and the operators that
launched it (the innermost `cpu_op` whose `External id` the kernel carries, and the operators enclosing that one):
GEMMs, attention with the backend that ran it, convolutions, normalisations, elementwise work, layout copies
(`copy_`, `contiguous`, `clone`, `cat`, transposes: bytes moved to lay a tensor out again, no arithmetic),
reductions, copies to and from the host, sets, and the rest. A CPU-only trace has no kernels: its operators' own
time (their time less their children's) is classed the same way, so that a tiny run on a laptop answers in the
same terms.

Where the trace recorded shapes (`record_shapes`, which `lab profile` and the A/B's profiles turn on), the
operators' arguments give three more things:

- the arithmetic (:mod:`lab.traces.arithmetic`): the FLOPs of every matmul, convolution and attention, and the
  bytes each class must at least move;
- the roofline (the same module): for the GPU the trace names, each class's achieved FLOP/s and bytes/s against the
  ceilings, and the step's model FLOP utilisation: its FLOPs over the step's wall time at the peak rate;
- strided inputs (:mod:`lab.traces.strides`): a matmul, linear, normalisation or attention fed a layout that costs
  a copy, with the Python line that called it.

The classes are :mod:`lab.traces.classify`'s, the operator tree :mod:`lab.traces.operators`'.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import numpy as np

from lab.traces import arithmetic, strides
from lab.traces.arithmetic import op_bytes, op_flops
from lab.traces.classify import CLASSES, LAYOUT, attention_backend, classify, strided_elementwise
from lab.traces.operators import Ops, site
from lab.traces.strides import needs_copy
from lab.traces.timeline import DRIVER_LAUNCHES, RUNTIME_LAUNCHES, Frames, step_of, steps, us
from lab.traces.trace import Trace

__all__ = ["CLASSES", "LAYOUT", "Ops", "attention_backend", "classify", "median_summary", "needs_copy", "op_bytes",
           "op_flops", "strided_elementwise", "summary", "work_analysis"]


def _launch_times(trace: Trace) -> dict[int, int]:
    rt = trace.cat("cuda_runtime").named(*RUNTIME_LAUNCHES)
    dr = trace.cat("cuda_driver").named(*DRIVER_LAUNCHES)
    return dict(zip(np.concatenate([rt.correlation, dr.correlation]).tolist(),
                    np.concatenate([rt.ts, dr.ts]).tolist()))


@dataclasses.dataclass
class _Work:
    """One row per piece of device work: its class, its attention backend, its duration (ns), the time that places
    it in a step (on the GPU: its launch), when it started, and the operator that launched it (-1: none)."""

    klass: list[str] = dataclasses.field(default_factory=list)
    backend: list[str | None] = dataclasses.field(default_factory=list)
    dur: list[int] = dataclasses.field(default_factory=list)
    when: list[int] = dataclasses.field(default_factory=list)
    began: list[int] = dataclasses.field(default_factory=list)
    op_of: list[int] = dataclasses.field(default_factory=list)
    strided: list[int] = dataclasses.field(default_factory=lambda: [0, 0])  # strided elementwise kernels, their ns

    def add(self, klass: str, backend: str | None, dur: int, when: int, began: int, op: int) -> None:
        self.klass.append(klass)
        self.backend.append(backend)
        self.dur.append(dur)
        self.when.append(when)
        self.began.append(began)
        self.op_of.append(op)


def work_analysis(trace: Trace, frames: Frames | None = None, top: int = 5) -> dict:
    """Device work by class over the whole trace and per denoising step, attention backends, where each class comes
    from, and, with shapes, the arithmetic, the roofline and the strided inputs (the module's docstring)."""
    frames = frames if frames is not None else Frames(trace)
    ops = Ops(trace)
    spans = steps(trace)
    on_gpu = trace.has_gpu
    work = _gpu_work(trace, ops) if on_gpu else _cpu_work(ops)
    if not work.klass:
        return {"missing": "no device work in this trace: neither GPU kernels nor CPU operators"}
    dur_a = np.asarray(work.dur, dtype=np.int64)
    out = _by_class(work, dur_a, spans, on_gpu)
    attention: dict[str, dict] = {}
    for b, d in zip(work.backend, work.dur):
        if b is not None:
            entry = attention.setdefault(b, {"us": 0.0, "count": 0})
            entry["us"] += us(d)
            entry["count"] += 1
    out["attention_backends"] = attention
    if on_gpu:
        out["strided_elementwise"] = {"count": work.strided[0], "us": us(work.strided[1])}
    cache: dict[int, str] = {}
    out["sites"] = _sites(work, ops, frames, cache, top)
    out.update(_from_shapes(trace, ops, spans, frames, cache, work, out))
    return out


def _gpu_work(trace: Trace, ops: Ops) -> _Work:
    """The GPU's kernels, copies and sets, each classed by its name and the operators that launched it."""
    work = _Work()
    launched = _launch_times(trace)
    classes: dict[tuple, tuple[str, str | None]] = {}  # (kernel, chain) -> its class: most kernels repeat
    for cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        events = trace.cat(cat)
        external = events.extra.get("external", np.full(len(events), -1)).tolist()
        for name, d, corr, ext, start in zip(events.names, events.dur.tolist(), events.correlation.tolist(),
                                              external, events.ts.tolist()):
            i = ops.by_external.get(ext, -1)
            chain = ops.chain(i) if i >= 0 else []
            if cat == "gpu_memcpy":
                c, b = ("layout copy" if "DtoD" in name else "host copy"), None
            elif cat == "gpu_memset":
                c, b = "memset", None
            else:
                key = (name, tuple(chain))
                found = classes.get(key)
                if found is None:
                    found = classes[key] = classify(name, chain)
                c, b = found
                if strided_elementwise(name):  # whatever its class: an elementwise add, a copy, a cast
                    work.strided[0] += 1
                    work.strided[1] += d
            work.add(c, b, d, launched.get(corr, start), start, i)
    return work


def _cpu_work(ops: Ops) -> _Work:
    """A CPU-only trace's operators by their own time (their time less their children's), classed the same way."""
    work = _Work()
    own = ops.self_time()
    for i, (name, d) in enumerate(zip(ops.ops.names, own.tolist())):
        if d > 0 and name.startswith("aten::"):
            c, b = classify(None, ops.chain(i))
            work.add(c, b, d, int(ops.ops.ts[i]), int(ops.ops.ts[i]), i)
    return work


def _by_class(work: _Work, dur_a: np.ndarray, spans, on_gpu: bool) -> dict:
    """Time and count by class over the trace and, with steps, per step, with the step's wall time."""
    step_idx = step_of(np.asarray(work.when, dtype=np.int64), spans) if spans else np.full(len(work.dur), -1)
    total = int(dur_a.sum())
    by_class = {}
    names = np.asarray(work.klass, dtype=object)
    for c in CLASSES:
        sel = names == c
        if sel.any():
            by_class[c] = {"us": us(dur_a[sel].sum()), "count": int(sel.sum()),
                           "share_pct": 100.0 * dur_a[sel].sum() / total if total else 0.0}
    out: dict = {"device": "gpu" if on_gpu else "cpu", "unit": "kernels" if on_gpu else "operators (own time)",
                 "total_us": us(total), "count": len(work.dur), "by_class": by_class}
    if spans:
        n_steps = len(spans)
        in_loop = step_idx >= 0
        out["per_step"] = {c: {"us": us(dur_a[in_loop & (names == c)].sum()) / n_steps,
                               "count": float((in_loop & (names == c)).sum()) / n_steps}
                           for c in CLASSES if (in_loop & (names == c)).any()}
        out["cpu_step_us"] = us(sum(e - s for _, s, e in spans)) / n_steps
        # a step's wall time is the device's: from the first piece of the loop's work to start to the last to end
        # (the host may run ahead of the device, so its own step spans can be shorter than the work they launched)
        start_a = np.asarray(work.began, dtype=np.int64)[in_loop]
        end_a = start_a + dur_a[in_loop]
        out["step_us"] = us(int(end_a.max()) - int(start_a.min())) / n_steps if on_gpu and in_loop.any() \
            else out["cpu_step_us"]
        out["steps"] = n_steps
    return out


def _sites(work: _Work, ops: Ops, frames: Frames | None, cache: dict[int, str], top: int) -> dict:
    """Where each class comes from: the user-code line that called the outermost launching operator, its `top`
    lines by time."""
    sites: dict[str, Counter] = defaultdict(Counter)
    site_counts: dict[str, Counter] = defaultdict(Counter)
    for c, d, i in zip(work.klass, work.dur, work.op_of):
        if c in ("gemm", "attention", "norm", "elementwise", "layout copy", "reduction", "conv") and i >= 0:
            where = site(frames, ops, i, cache) if frames else "(no Python stack)"
            sites[c][where] += d
            site_counts[c][where] += 1
    return {c: [{"site": s, "us": us(t), "count": site_counts[c][s]} for s, t in found.most_common(top)]
            for c, found in sites.items()}


def _from_shapes(trace: Trace, ops: Ops, spans, frames: Frames | None, cache: dict[int, str], work: _Work,
                 found: dict) -> dict:
    """FLOPs, bytes, the roofline and strided inputs from the operators' shapes; `missing` without shapes."""
    dims_col = ops.ops.extra.get("dims")
    if dims_col is None or not any(d is not None for d in dims_col.tolist()[:2000]):
        why = "no operator shapes in this trace: profile with shapes (`lab profile` records them)"
        return {"flops": {"missing": why}, "strided_inputs": {"missing": why}, "roofline": {"missing": why}}
    n_steps = len(spans) or None
    step_idx = step_of(ops.ops.ts, spans) if spans else np.full(len(ops.ops.names), -1)
    flops = arithmetic.flops(ops, work.klass, work.op_of, step_idx, n_steps)
    return {"flops": flops, "strided_inputs": strides.strided_inputs(ops, frames, cache, step_idx, n_steps),
            "roofline": arithmetic.roofline(trace, flops, found, n_steps)}


def summary(work: dict, top: int = 5) -> dict:
    """The part of :func:`work_analysis` a result keeps: per step (or per call, without steps) time and count by
    class, attention backends, strided elementwise kernels, strided inputs, FLOPs and the roofline; sites only for the
    layout copies and strided inputs (the waste the lab hunts)."""
    if "missing" in work:
        return dict(work)
    per = "step" if work.get("per_step") else "call"
    out = {"device": work["device"], "unit": work["unit"], "per": per,
           "by_class": work["per_step"] if per == "step" else
           {c: {"us": v["us"], "count": v["count"]} for c, v in work["by_class"].items()},
           "step_us": work.get("step_us"), "cpu_step_us": work.get("cpu_step_us"),
           "attention_backends": work["attention_backends"],
           "layout_copy_sites": (work.get("sites") or {}).get(LAYOUT, [])[:top]}
    if "strided_elementwise" in work:
        out["strided_elementwise"] = work["strided_elementwise"]
    strided = work.get("strided_inputs") or {}
    out["strided_inputs"] = strided if "missing" in strided else {**strided, "sites": strided.get("sites", [])[:top]}
    flops = work.get("flops") or {}
    out["flops_per_step"] = flops.get("per_step") if "missing" not in flops else None
    roof = work.get("roofline") or {}
    out["roofline"] = roof if "missing" in roof else {k: roof[k] for k in
                                                      ("gpu", "dtype", "peak_tflops", "peak_tbs", "source", "per",
                                                       "floor_us", "mfu_pct", "by_class")}
    return out


def median_summary(summaries: list[dict]) -> dict:
    """Several profiled calls' summaries as one: each class's time and count the median over the calls (and the
    step's time and MFU likewise), the rest the first call's."""
    first = summaries[0]
    if "missing" in first or len(summaries) == 1:
        return first
    usable = [s for s in summaries if "missing" not in s]

    def median(values: list[float]) -> float:
        return float(np.median(values)) if values else 0.0

    out = dict(first)
    classes = {c for s in usable for c in s["by_class"]}
    out["by_class"] = {c: {k: median([s["by_class"].get(c, {}).get(k, 0.0) for s in usable]) for k in ("us", "count")}
                       for c in CLASSES if c in classes}
    steps_us = [s["step_us"] for s in usable if s.get("step_us") is not None]
    if steps_us:
        out["step_us"] = median(steps_us)
    mfus = [s["roofline"]["mfu_pct"] for s in usable
            if "missing" not in s["roofline"] and s["roofline"].get("mfu_pct")]
    if mfus and "missing" not in out["roofline"]:
        out["roofline"] = {**out["roofline"], "mfu_pct": median(mfus)}
    out["calls"] = len(usable)
    return out

"""The diffusers profiling guide's quick checklist, answered from one analysed trace: each question with the
measured value and healthy / borderline / unhealthy by the guide's own thresholds (idle gaps under 100 µs,
`scheduler_step` under 1 % of a step, launch latency under 10 µs), or what to capture when the trace cannot say.
"""

from __future__ import annotations

HEALTHY, BORDERLINE, UNHEALTHY, UNKNOWN = "healthy", "borderline", "unhealthy", "cannot tell"


def _item(question: str, value: str, verdict: str, threshold: str, note: str = "") -> dict:
    return {"question": question, "value": value, "verdict": verdict, "threshold": threshold, "note": note}


def _in_loop(per_step: dict | None) -> list[float]:
    return [v for k, v in (per_step or {}).items() if k != "outside"]


def checklist(r: dict, eager: dict | None = None) -> list[dict]:
    """Six questions over the result of `lab.traces.analysis.analyze` (`eager`: the analysis of an eager trace of the same
    call, for "is compile effective")."""
    steps = r["steps"]
    need_steps = "profile with `lab profile` (or the upstream harness's labels) to get denoise_step spans"
    out = []

    # 1. the GPU stays busy: no idle gap over 100 µs inside the denoising loop
    g = r["gpu"]
    if "missing" in g:
        out.append(_item("GPU staying busy", "n/a", UNKNOWN, "no idle gap > 100 µs per step", g["missing"]))
    elif steps and g.get("denoise_gaps_over_100us") is not None:
        per = g["denoise_gaps_over_100us"] / steps
        verdict = HEALTHY if per == 0 else BORDERLINE if per <= 1 else UNHEALTHY
        out.append(_item("GPU staying busy", f"{per:.2f} idle gaps > 100 µs per step", verdict,
                         "none per step healthy; more than one per step unhealthy"))
    else:
        out.append(_item("GPU staying busy", f"{g['gaps_over_us']['100']} idle gaps > 100 µs in the whole trace",
                         UNKNOWN, "no idle gap > 100 µs per step", need_steps))

    # 2. the CPU does not block on the GPU inside the loop
    s = r["syncs"]
    if s["per_step"] is None:
        out.append(_item("CPU blocking on GPU", f"{s['count']} syncs in the trace", UNKNOWN, "0 syncs per step",
                         need_steps))
    elif "missing" in g:
        out.append(_item("CPU blocking on GPU", "n/a", UNKNOWN, "0 syncs per step",
                         "a CPU-only trace has no device syncs; its host scalar reads are in the report above"))
    else:
        per = sum(_in_loop(s["per_step"])) / steps
        out.append(_item("CPU blocking on GPU", f"{per:.2f} syncs per step in the loop", HEALTHY if per == 0 else UNHEALTHY,
                         "0 per step"))

    # 3. the scheduler's share of a step
    step_us = r.get("step_us_total")
    sched = r["regions"]["regions"].get("scheduler_step")
    if sched and step_us:
        share = sched["total_us"] / step_us
        verdict = HEALTHY if share < 0.01 else UNHEALTHY if share > 0.05 else BORDERLINE
        out.append(_item("Scheduler overhead", f"scheduler_step {share:.2%} of the steps", verdict,
                         "< 1 % healthy, > 5 % unhealthy"))
    else:
        out.append(_item("Scheduler overhead", "n/a", UNKNOWN, "< 1 % healthy, > 5 % unhealthy",
                         "needs scheduler_step and denoise_step spans: " + need_steps))

    # 4. compile effective: fewer, larger kernels than eager, no recompiles, few eager islands
    c = r["compile"]
    if not c.get("compiled"):
        out.append(_item("Compile effective", "not compiled", UNKNOWN, "fewer kernels per step than eager, no graph "
                         "breaks or recompiles", "the trace ran eagerly; compare a compiled trace with it "
                         "(`lab analyze EAGER COMPILED`)"))
    else:
        problems = []
        if c["recompiled"]:
            problems.append(f"{len(c['recompiled'])} recompiled frame(s)")
        if c.get("graph_breaks"):
            problems.append(f"{c['graph_breaks']} graph break(s) (compiler log)")
        value = f"{c['launches']['outside_share']:.0%} of launches outside compiled regions"
        ratio = None
        if eager and eager.get("kernels_per_step") and c.get("kernels_per_step"):
            ratio = eager["kernels_per_step"] / c["kernels_per_step"]
            value += f"; {c['kernels_per_step']:,.0f} kernels per step against {eager['kernels_per_step']:,.0f} eager"
            if ratio <= 1:
                problems.append("no fewer kernels than eager")
        elif c.get("kernels_per_step"):
            value += f"; {c['kernels_per_step']:,.0f} kernels per step"
        verdict = UNHEALTHY if problems else HEALTHY if ratio else BORDERLINE
        out.append(_item("Compile effective", value + (f" ({', '.join(problems)})" if problems else ""), verdict,
                         "fewer kernels per step than eager, no graph breaks or recompiles",
                         "" if ratio else "give an eager trace too for the kernel count against eager"))

    # 5. kernel launch latency
    ln = r["launches"]
    if "latency_us" not in ln:
        out.append(_item("Kernel launch latency", "n/a", UNKNOWN, "< 10 µs healthy, > 20 µs unhealthy",
                         "needs GPU activity in the trace"))
    else:
        lat = ln["latency_us"]["median"]
        if ln.get("cpu_runs_ahead"):
            shown = f"median {lat / 1000:,.1f} ms" if lat >= 1000 else f"median {lat:,.1f} µs"
            out.append(_item("Kernel launch latency", shown + " (queueing)", HEALTHY,
                             "< 10 µs healthy, > 20 µs unhealthy",
                             f"the CPU runs far ahead (queue depth median {ln['queue_depth']['median']:.0f}): the "
                             "latency is queueing behind earlier work, not launch overhead"))
        else:
            verdict = HEALTHY if lat < 10 else UNHEALTHY if lat > 20 else BORDERLINE
            out.append(_item("Kernel launch latency", f"median {lat:,.1f} µs", verdict, "< 10 µs healthy, > 20 µs unhealthy"))

    # 6. memory stable across steps
    m = r["memory"]
    if "missing" in m:
        out.append(_item("Memory stable", "n/a", UNKNOWN, "flat across steps", m["missing"]))
    elif "grows_across_steps" not in m:
        out.append(_item("Memory stable", f"peak {m['peak_bytes'] / 2**20:,.0f} MiB", UNKNOWN, "flat across steps",
                         need_steps))
    else:
        out.append(_item("Memory stable", "grows every step" if m["grows_across_steps"] else "flat across steps",
                         UNHEALTHY if m["grows_across_steps"] else HEALTHY, "flat across steps"))
    return out

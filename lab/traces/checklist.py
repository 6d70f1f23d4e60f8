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


#: what to capture where a question needs the denoising steps
NEED_STEPS = "profile with `lab profile` (or the upstream harness's labels) to get denoise_step spans"


def checklist(r: dict, eager: dict | None = None) -> list[dict]:
    """Six questions over the result of `lab.traces.analysis.analyze` (`eager`: the analysis of an eager trace of the
    same call, for "is compile effective")."""
    return [_gpu_busy(r), _cpu_blocking(r), _scheduler(r), _compile(r, eager), _launch_latency(r), _memory(r)]


def _gpu_busy(r: dict) -> dict:
    """1. The GPU stays busy: no idle gap over 100 µs inside the denoising loop."""
    g, steps = r["gpu"], r["steps"]
    if "missing" in g:
        return _item("GPU staying busy", "n/a", UNKNOWN, "no idle gap > 100 µs per step", g["missing"])
    if steps and g.get("denoise_gaps_over_100us") is not None:
        per = g["denoise_gaps_over_100us"] / steps
        verdict = HEALTHY if per == 0 else BORDERLINE if per <= 1 else UNHEALTHY
        return _item("GPU staying busy", f"{per:.2f} idle gaps > 100 µs per step", verdict,
                     "none per step healthy; more than one per step unhealthy")
    return _item("GPU staying busy", f"{g['gaps_over_us']['100']} idle gaps > 100 µs in the whole trace", UNKNOWN,
                 "no idle gap > 100 µs per step", NEED_STEPS)


def _cpu_blocking(r: dict) -> dict:
    """2. The CPU does not block on the GPU inside the loop."""
    s = r["syncs"]
    if s["per_step"] is None:
        return _item("CPU blocking on GPU", f"{s['count']} syncs in the trace", UNKNOWN, "0 syncs per step",
                     NEED_STEPS)
    if "missing" in r["gpu"]:
        return _item("CPU blocking on GPU", "n/a", UNKNOWN, "0 syncs per step",
                     "a CPU-only trace has no device syncs; its host scalar reads are in the report above")
    per = sum(_in_loop(s["per_step"])) / r["steps"]
    return _item("CPU blocking on GPU", f"{per:.2f} syncs per step in the loop", HEALTHY if per == 0 else UNHEALTHY,
                 "0 per step")


def _scheduler(r: dict) -> dict:
    """3. The scheduler's share of a step."""
    step_us = r.get("step_us_total")
    sched = r["regions"]["regions"].get("scheduler_step")
    if sched and step_us:
        share = sched["total_us"] / step_us
        verdict = HEALTHY if share < 0.01 else UNHEALTHY if share > 0.05 else BORDERLINE
        return _item("Scheduler overhead", f"scheduler_step {share:.2%} of the steps", verdict,
                     "< 1 % healthy, > 5 % unhealthy")
    return _item("Scheduler overhead", "n/a", UNKNOWN, "< 1 % healthy, > 5 % unhealthy",
                 "needs scheduler_step and denoise_step spans: " + NEED_STEPS)


def _compile(r: dict, eager: dict | None) -> dict:
    """4. Compile effective: fewer, larger kernels than eager, no recompiles, few eager islands."""
    c = r["compile"]
    if not c.get("compiled"):
        return _item("Compile effective", "not compiled", UNKNOWN, "fewer kernels per step than eager, no graph "
                     "breaks or recompiles", "the trace ran eagerly; compare a compiled trace with it "
                     "(`lab analyze EAGER COMPILED`)")
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
    return _item("Compile effective", value + (f" ({', '.join(problems)})" if problems else ""), verdict,
                 "fewer kernels per step than eager, no graph breaks or recompiles",
                 "" if ratio else "give an eager trace too for the kernel count against eager")


def _launch_latency(r: dict) -> dict:
    """5. Kernel launch latency: launch overhead, unless the CPU runs far ahead and it is queueing."""
    ln = r["launches"]
    if "latency_us" not in ln:
        return _item("Kernel launch latency", "n/a", UNKNOWN, "< 10 µs healthy, > 20 µs unhealthy",
                     "needs GPU activity in the trace")
    lat = ln["latency_us"]["median"]
    if ln.get("cpu_runs_ahead"):
        shown = f"median {lat / 1000:,.1f} ms" if lat >= 1000 else f"median {lat:,.1f} µs"
        return _item("Kernel launch latency", shown + " (queueing)", HEALTHY, "< 10 µs healthy, > 20 µs unhealthy",
                     f"the CPU runs far ahead (queue depth median {ln['queue_depth']['median']:.0f}): the latency is "
                     "queueing behind earlier work, not launch overhead")
    verdict = HEALTHY if lat < 10 else UNHEALTHY if lat > 20 else BORDERLINE
    return _item("Kernel launch latency", f"median {lat:,.1f} µs", verdict, "< 10 µs healthy, > 20 µs unhealthy")


def _memory(r: dict) -> dict:
    """6. Memory stable across steps."""
    m = r["memory"]
    if "missing" in m:
        return _item("Memory stable", "n/a", UNKNOWN, "flat across steps", m["missing"])
    if "grows_across_steps" not in m:
        return _item("Memory stable", f"peak {m['peak_bytes'] / 2**20:,.0f} MiB", UNKNOWN, "flat across steps",
                     NEED_STEPS)
    return _item("Memory stable", "grows every step" if m["grows_across_steps"] else "flat across steps",
                 UNHEALTHY if m["grows_across_steps"] else HEALTHY, "flat across steps")

"""Text presentation of `lab analyze` results (computation lives in `lab.traces.analysis`)."""

from __future__ import annotations

from tabulate import tabulate

from lab.pages.work_report import format_work


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if unit == "us":
            return f"{v / 1000:.3f} ms" if abs(v) >= 1000 else f"{v:.1f} µs"
        return f"{v:.2f}"
    return f"{v}"


def format_analysis(r: dict, top: int = 8) -> list[str]:
    lines = [f"Trace: {r['trace']}" + (f" ({r['device']})" if r["device"] else ""),
             f"Denoising steps annotated: {r['steps']}; Python stacks: {'yes' if r['with_stack'] else 'no'}"]
    if r.get("trace_checks"):
        lines.append("Trace checks: " + "; ".join(r["trace_checks"]))
    s = r["syncs"]
    lines += ["", f"Syncs (host blocked): {s['count']}, {_fmt(s['blocked_us'], 'us')} blocked"]
    for call, v in s["by_call"].items():
        lines.append(f"  {call}: {v['count']} ({_fmt(v['blocked_us'], 'us')})")
    if s["per_step"]:
        lines.append("  per step: " + ", ".join(f"{k}: {v}" for k, v in s["per_step"].items()))
    if s["sites"]:
        rows = [[site, v["count"], _fmt(v["blocked_us"], "us")] for site, v in list(s["sites"].items())[:top]]
        lines += ["  by call site (innermost user frame; line = the function's def line):"]
        lines += ["    " + ln for ln in tabulate(rows, headers=["site", "syncs", "blocked"]).splitlines()]
    h = r["host_reads"]
    lines += ["", f"Host scalar reads (aten::_local_scalar_dense): {h['scalar_reads']}; aten::nonzero: {h['nonzero']}"]
    if h["scalar_reads_per_step"]:
        lines.append("  per step: " + ", ".join(f"{k}: {v}" for k, v in h["scalar_reads_per_step"].items()))
    for site, n in list(h["scalar_read_sites"].items())[:top]:
        lines.append(f"  {n:5d}  {site}")
    if h["memcpy"]:
        lines.append("  memcpy: " + ", ".join(f"{d} {v['count']} ({v['bytes']} B)" for d, v in h["memcpy"].items()))
    g = r["gpu"]
    lines.append("")
    if "missing" in g:
        lines.append(f"GPU busy/idle: {g['missing']}")
    else:
        w = g["whole"]
        lines.append(f"GPU idle (whole trace): {_fmt(w['idle_us'], 'us')} of {_fmt(w['span_us'], 'us')} "
                     f"({w['idle_pct']:.2f} %), busy {_fmt(w['busy_us'], 'us')}")
        if g["denoise"]:
            d = g["denoise"]
            lines.append(f"GPU idle (denoising window): {_fmt(d['idle_us'], 'us')} of {_fmt(d['span_us'], 'us')} ({d['idle_pct']:.2f} %)")
        lines.append("  idle gaps: " + ", ".join(f"> {k} µs: {v}" for k, v in g["gaps_over_us"].items()))
        for gap in g["gaps"][:top]:
            lines.append(f"  {_fmt(gap['length_us'], 'us'):>10} at +{gap['start_us'] / 1000:.1f} ms  {gap['cause']}")
    c = r["cpu_gaps"]
    lines.append("")
    if "missing" in c:
        lines.append(f"CPU gaps between transformer_forward: {c['missing']}")
    else:
        shown = ", ".join(f"{x:,.0f}" for x in c["gaps_us"][:12])
        lines.append(f"CPU gaps between transformer_forward: {c['count']} gaps, total {_fmt(c['total_us'], 'us')} "
                     f"(µs: {shown}{' ...' if c['count'] > 12 else ''})")
    ln = r["launches"]
    lines.append(f"\nLaunches: {ln['total']} (runtime {sum(ln['runtime'].values())}, driver {sum(ln['driver'].values())})")
    if ln.get("per_step"):
        lines.append("  per step: " + ", ".join(f"{k}: {v}" for k, v in ln["per_step"].items()))
    if "latency_us" in ln:
        lat, q = ln["latency_us"], ln["queue_depth"]
        lines.append(f"  launch-to-start latency: median {_fmt(lat['median'], 'us')}, p90 {_fmt(lat['p90'], 'us')}, "
                     f"max {_fmt(lat['max'], 'us')}; queue depth median {q['median']:.0f}, max {q['max']}")
        if ln["cpu_runs_ahead"]:
            lines.append("  the CPU runs far ahead of the GPU: that latency is queueing, not launch overhead")
    m = r["memory"]
    if "missing" in m:
        lines.append(f"\nMemory: {m['missing']}")
    else:
        lines.append(f"\nMemory: peak allocated {m['peak_bytes'] / 2**20:.0f} MiB"
                     + ("; GROWS across steps" if m.get("grows_across_steps") else ""))
    regions = r["regions"]
    if regions["regions"] or regions["functions"]:
        lines.append("\nRegions and functions:")
        for name, v in {**regions["regions"], **regions["functions"]}.items():
            lines.append(f"  {name}: {v['count']} calls, {_fmt(v['total_us'], 'us')}" + (f" ({v['missing']})" if "missing" in v else ""))
    lines += format_gaps(r["gaps"], top)
    if "work" in r:
        lines += format_work(r["work"], top)
    lines += format_compile(r["compile"], top)
    lines += format_checklist(r["checklist"])
    for note in r["notes"]:
        lines.append(f"note: {note}")
    return lines


def format_gaps(g: dict, top: int = 8) -> list[str]:
    """What the host did in the CPU gaps and GPU idle gaps, by kind of gap and by function."""
    lines = ["", f"What the host did in the gaps (GPU idle gaps over {g['idle_threshold_us']:g} µs, and CPU gaps "
                 "between transformer calls):"]
    for note in g["notes"]:
        lines.append(f"  note: {note}")
    for k in g["kinds"]:
        lines.append(f"  {k['source']}, {k['kind']}: {k['gaps']} gaps, {_fmt(k['total_us'], 'us')} in all, median "
                     f"{_fmt(k['median_us'], 'us')}, max {_fmt(k['max_us'], 'us')}")
        if k["functions"]:
            rows = [[_fmt(f["self_us"], "us"), _fmt(f["inclusive_us"], "us"), f["function"]] for f in k["functions"][:top]]
            lines += ["    " + ln for ln in tabulate(rows, headers=["self", "inclusive", "function"]).splitlines()]
        if k.get("callers"):
            lines.append("    by inclusive time: " + "; ".join(f"{c['function']} {_fmt(c['inclusive_us'], 'us')}"
                                                           for c in k["callers"][:4]))
        if k["hottest_chain"]:
            chain = k["hottest_chain"]["chain"].split(";")
            shown = " <- ".join(reversed(chain[-4:])) + (" <- ..." if len(chain) > 4 else "")
            lines.append(f"    hottest chain ({_fmt(k['hottest_chain']['self_us'], 'us')} self): {shown}")
    return lines


def format_compile(c: dict, top: int = 8) -> list[str]:
    lines = ["", "Compile:"]
    if not c.get("compiled"):
        lines.append(f"  {c['note']}")
    else:
        for frame, f in c["frames"].items():
            per_step = f" ({f['calls_per_step']:.0f} per step)" if f["calls_per_step"] else ""
            ids = ", ".join(f"{cid}: {n} calls" for cid, n in f["compile_ids"].items())
            lines.append(f"  compiled frame {frame}: {f['calls']} calls{per_step}; compile ids {ids}")
        if c["recompiled"]:
            lines.append("  RECOMPILED: " + ", ".join(f"frame {r['frame']} compile {r['compile_id']} ({r['calls']} calls)"
                                                     for r in c["recompiled"]))
        else:
            lines.append("  no recompiles (every compiled call used compile id 0)")
        lines.append(f"  Inductor graphs: {c['graphs']['distinct']} distinct, {c['graphs']['calls']} calls")
        g = c["guards"]
        per_step = f", {_fmt(g['per_step_us'], 'us')} per step" if g["per_step_us"] is not None else ""
        lines.append(f"  guard evaluation (TorchDynamo Cache Lookup): {g['lookups']} lookups, {_fmt(g['total_us'], 'us')} in "
                     f"all, {_fmt(g['per_pipeline_call_us'], 'us')} per pipeline call{per_step}, median "
                     f"{_fmt(g['median_us'], 'us')} per lookup")
        ln = c["launches"]
        lines.append(f"  launches: {ln['inside']} inside compiled regions, {ln['outside']} outside ({ln['outside_share']:.1%}); "
                     f"GPU time {_fmt(ln['gpu_us_inside'], 'us')} inside, {_fmt(ln['gpu_us_outside'], 'us')} outside")
        sites = c.get("outside_sites") or {}
        if "missing" in sites:
            lines.append(f"  eager launches by site: {sites['missing']}")
        elif sites:
            lines.append("  eager launches by site (innermost user frame):")
            lines += [f"    {v['launches']:5d} launches, {_fmt(v['gpu_us'], 'us'):>10} GPU  {site}"
                      for site, v in list(sites.items())[:top]]
    for key, label in (("kernels_per_transformer_call", "per transformer call"), ("kernels_per_step", "per step")):
        if c.get(key) is not None:
            lines.append(f"  GPU work launched {label}: {c[key]:,.1f}")
    return lines


def format_checklist(items: list[dict]) -> list[str]:
    lines = ["", "The profiling guide's quick checklist:"]
    rows = [[i["question"], i["value"], i["verdict"], i["threshold"], i["note"]] for i in items]
    lines += ["  " + ln for ln in tabulate(rows, headers=["question", "measured", "verdict", "healthy when", "note"],
                                          maxcolwidths=[None, 45, None, 30, 45]).splitlines()]
    return lines


METRIC_UNITS = {"sync_blocked_us": "us", "gpu_idle_us": "us", "gpu_idle_denoise_us": "us", "cpu_gaps_total_us": "us"}


def format_compare(c: dict, top: int = 15) -> list[str]:
    lines = [f"control: {c['control']['trace']}", f"test:    {c['test']['trace']}", ""]
    rows = [[k, _fmt(v["control"], METRIC_UNITS.get(k, "")), _fmt(v["test"], METRIC_UNITS.get(k, "")),
             _fmt(v["delta"], METRIC_UNITS.get(k, ""))] for k, v in c["metrics"].items()]
    lines += tabulate(rows, headers=["metric", "control", "test", "delta"]).splitlines()
    changed = [[s, v["control"], v["test"]] for s, v in c["sync_sites"].items() if v["control"] != v["test"]]
    if changed:
        lines += ["", "Sync sites that changed:"]
        lines += tabulate(changed[:top], headers=["site", "control", "test"]).splitlines()
    reads = [[s, v["control"], v["test"]] for s, v in c.get("read_sites", {}).items() if v["control"] != v["test"]]
    if reads:
        lines += ["", "Host scalar read sites that changed:"]
        lines += tabulate(reads[:top], headers=["site", "control", "test"]).splitlines()
    fusion = c.get("fusion")
    if fusion:
        lines += ["", "Compiled against eager (GPU work launched):"]
        for key, label in (("kernels_per_transformer_call", "per transformer call"), ("kernels_per_step", "per step")):
            f = fusion[key]
            if f["eager"] is not None and f["compiled"] is not None:
                lines.append(f"  {label}: eager {f['eager']:,.1f}, compiled {f['compiled']:,.1f}"
                             + (f": {f['ratio']:.1f}x fewer" if f["ratio"] else ""))
    moved = [m for m in c.get("gap_functions", []) if abs(m["delta_us"]) >= 1]
    if moved:
        lines += ["", "Host time in the gaps that moved (inclusive time, by function):"]
        lines += tabulate([[m["source"], m["function"][:90], _fmt(m["control_us"], "us"), _fmt(m["test_us"], "us"),
                            _fmt(m["delta_us"], "us")] for m in moved],
                          headers=["gaps", "function", "control", "test", "delta"]).splitlines()
    names = list(c["name_counts"].items())
    if names:
        lines += ["", f"Event counts that changed ({len(names)} names; addresses normalised):"]
        shown = names[:top] + (names[-top:] if len(names) > 2 * top else names[top:])
        lines += tabulate([[n[:100], v["control"], v["test"], v["delta"]] for n, v in shown],
                          headers=["name", "control", "test", "delta"]).splitlines()
    return lines

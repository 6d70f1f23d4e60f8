"""How the pages show where the device time goes (`lab.traces.work`): a text section for `lab analyze` and
`lab profile`, a before/after table for an A/B page, and the census's cells."""

from __future__ import annotations

from tabulate import tabulate


def _classes(*by_class: dict) -> list[str]:
    """The classes of one or more arms, in the order the analysis lists them (`lab.traces.work.CLASSES`)."""
    return list(dict.fromkeys(c for classes in by_class for c in classes))


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:,.3f} ms" if abs(us) >= 1000 else f"{us:,.1f} µs"


def _flops(f: float | None) -> str:
    if not f:
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if f >= scale:
            return f"{f / scale:,.2f} {unit}"
    return f"{f:,.0f} FLOP"


def _change(before: float, after: float) -> str:
    return "=" if before == after else ("+" if after > before else "-") + _ms(abs(after - before))


def backends_text(backends: dict) -> str:
    return ", ".join(f"{b} ({v['count']} calls, {_ms(v['us'])})" for b, v in backends.items()) or "none"


def roofline_sentence(roof: dict, per: str, markdown: bool = True) -> str:
    if "missing" in roof:
        return f"Roofline: {roof['missing']}."
    mfu = f"{roof['mfu_pct']:.1f} %" if roof.get("mfu_pct") is not None else "n/a"
    source = f"[datasheet]({roof['source']})" if markdown else f"datasheet {roof['source']}"
    return (f"Roofline ({roof['gpu']}, {roof['dtype']}: {roof['peak_tflops']:,.0f} TFLOP/s and "
            f"{roof['peak_tbs']:g} TB/s, {source}): model FLOP utilisation {mfu} of the {per}; "
            f"at the ceilings the {per}'s work would take {_ms(roof['floor_us'])}.")


def format_work(w: dict, top: int = 5) -> list[str]:
    """The `Device work` section of `lab analyze` (the whole analysis of `lab.traces.work.work_analysis`)."""
    lines = ["", "Device work by kind:"]
    if "missing" in w:
        return lines + [f"  {w['missing']}"]
    per_step = w.get("per_step")
    flops = w.get("flops") or {}
    roof = w.get("roofline") or {}
    rows = []
    for c in _classes(w["by_class"]):
        whole = w["by_class"][c]
        step = (per_step or {}).get(c)
        fl = (flops.get("by_class") or {}).get(c) if "missing" not in flops else None
        rr = (roof.get("by_class") or {}).get(c, {}) if "missing" not in roof else {}
        rows.append([c, _ms(whole["us"]), f"{whole['share_pct']:.1f} %", whole["count"],
                     _ms(step["us"]) if step else "", f"{step['count']:,.1f}" if step else "",
                     _flops(fl) if fl else "", f"{rr['tflops']:,.1f}" if rr.get("tflops") else "",
                     f"{rr['gbs']:,.0f}" if rr.get("gbs") else "",
                     f"{rr['over_floor']:,.1f}x" if rr.get("over_floor") else ""])
    headers = ["class", "time", "share", w["unit"], "per step", "count/step", "FLOPs", "TFLOP/s", "GB/s", "over floor"]
    lines += ["  " + ln for ln in tabulate(rows, headers=headers).splitlines()]
    lines.append(f"  attention backends: {backends_text(w['attention_backends'])}")
    if "strided_elementwise" in w:
        s = w["strided_elementwise"]
        lines.append(f"  elementwise kernels of the strided kind (an operand not contiguous; adds, copies, casts): "
                     f"{s['count']}, {_ms(s['us'])}")
    strided = w.get("strided_inputs") or {}
    if "missing" in flops:  # no shapes: the FLOPs, the roofline and the strided inputs all need them
        lines.append(f"  FLOPs, roofline and strided inputs: {flops['missing']}")
    else:
        per = f", {_flops(flops['per_step'])} per step" if flops.get("per_step") else ""
        lines.append(f"  FLOPs: {_flops(flops['total'])} in all{per} (matmuls, convolutions, attention; {flops['dtype']})")
        lines.append("  " + roofline_sentence(roof, "step" if per_step else "trace", markdown=False))
        if strided["count"]:
            per = f" ({strided['per_step']:,.1f} per step)" if strided.get("per_step") is not None else ""
            lines.append(f"  strided inputs to matmuls, norms and attention: {strided['count']}{per}")
            rows = [[r["count"], r["op"], f"arg {r['argument']}: {r['sizes']} strides {r['strides']}", r["site"]]
                    for r in strided["sites"][:top]]
            lines += ["    " + ln for ln in tabulate(rows, headers=["calls", "operator", "input", "called from"]).splitlines()]
        else:
            lines.append("  strided inputs to matmuls, norms and attention: none")
    layout = (w.get("sites") or {}).get("layout copy") or []
    if layout:
        lines.append("  layout copies by call site:")
        lines += [f"    {_ms(s['us']):>12}  {s['count']:5d}  {s['site']}" for s in layout[:top]]
    return lines


def work_table(summary_: dict) -> list[str]:
    """Markdown for one profiled call's device work: time and count per step (per call without steps) by class,
    the attention backends, the strided inputs and the profiled step's model FLOP utilisation."""
    if not summary_ or "missing" in summary_:
        return [f"Device work: {(summary_ or {}).get('missing', 'not recorded')}.", ""]
    per = summary_.get("per", "call")
    total = sum(v["us"] for v in summary_["by_class"].values()) or 1.0
    lines = [f"Device work per {per} by kind ({summary_['unit']}, one profiled call):", "",
             "| class | time | count | share |", "|---|---|---|---|"]
    lines += [f"| {c} | {_ms(v['us'])} | {v['count']:,.1f} | {100 * v['us'] / total:.1f} % |"
              for c, v in summary_["by_class"].items()]
    notes = [f"Attention backends: {backends_text(summary_['attention_backends'])}."]
    strided = summary_.get("strided_inputs") or {}
    if "missing" not in strided:
        notes.append(f"Strided inputs to matmuls, norms and attention: {strided['count']}.")
    roof = summary_.get("roofline") or {}
    if "missing" not in roof:
        notes.append(roofline_sentence(roof, per) + " The profiler slows the step.")
    return lines + ["", " ".join(notes), ""]


def mfu(summary: dict, step_ms: float | None) -> float | None:
    """A step's model FLOP utilisation at a step time measured without the profiler (`step_ms`): its FLOPs over that
    time at the GPU's peak rate, in percent; None without FLOPs, a roofline or the time."""
    roof = summary.get("roofline") or {}
    flops = summary.get("flops_per_step")
    if not step_ms or not flops or "missing" in roof:
        return None
    return 100.0 * flops / (step_ms * 1e-3) / (roof["peak_tflops"] * 1e12)


def work_rows(control: dict, test: dict, step_ms: dict[str, float] | None = None) -> list[str]:
    """Markdown lines for an A/B page: each arm's device time by class (per step, or per call without steps), the
    attention backends, strided inputs and model FLOP utilisation: at the timed steps where `step_ms` (each arm's
    mean step time without the profiler) is given, else at the profiled steps, which the profiler slows. Empty where
    neither arm has the analysis."""
    if not control or not test or "missing" in control or "missing" in test:
        return []
    per = control.get("per", "call")
    calls = control.get("calls", 1)
    over = f"median over {calls} profiled calls" if calls > 1 else "one profiled call"
    lines = [f"Device work per {per} by kind ({control['unit']}; {over}):", "",
             "| class | before | after | change |", "|---|---|---|---|"]
    for c in _classes(control["by_class"], test["by_class"]):
        a, b = control["by_class"].get(c), test["by_class"].get(c)
        ua, ub = (a or {}).get("us", 0.0), (b or {}).get("us", 0.0)
        lines.append(f"| {c} | {_ms(ua)} | {_ms(ub)} | {_change(ua, ub)} |")
    ta = sum(v["us"] for v in control["by_class"].values())
    tb = sum(v["us"] for v in test["by_class"].values())
    lines += [f"| **all** | {_ms(ta)} | {_ms(tb)} | {_change(ta, tb)} |", ""]
    notes = []
    if control["attention_backends"] or test["attention_backends"]:
        ba, bb = backends_text(control["attention_backends"]), backends_text(test["attention_backends"])
        notes.append(f"Attention backends in the call: {ba}" + ("" if ba == bb else f" -> {bb}") + ".")
    sa, sb = control.get("strided_inputs") or {}, test.get("strided_inputs") or {}
    if "missing" not in sa and "missing" not in sb and (sa.get("count") or sb.get("count")):
        notes.append(f"Strided inputs to matmuls, norms and attention: {sa['count']} -> {sb['count']}"
                     + (f" (first: `{sa['sites'][0]['op']}` from {sa['sites'][0]['site']})" if sa.get("sites") else "")
                     + ".")
    ra, rb = control.get("roofline") or {}, test.get("roofline") or {}
    if "missing" not in ra and "missing" not in rb and ra.get("mfu_pct") is not None and rb.get("mfu_pct") is not None:
        timed = {arm: mfu(s, (step_ms or {}).get(arm)) for arm, s in (("control", control), ("test", test))}
        if timed["control"] is not None and timed["test"] is not None:
            at = f"model FLOP utilisation {timed['control']:.1f} % -> {timed['test']:.1f} % of the timed {per}"
        else:
            at = (f"model FLOP utilisation {ra['mfu_pct']:.1f} % -> {rb['mfu_pct']:.1f} % of the profiled {per} "
                  "(which the profiler slows)")
        notes.append(f"Roofline ({ra['gpu']}, {ra['dtype']}: {ra['peak_tflops']:,.0f} TFLOP/s and {ra['peak_tbs']:g} "
                     f"TB/s, [datasheet]({ra['source']})): {at}; at the ceilings the {per}'s device work would take "
                     f"{_ms(ra['floor_us'])}.")
    return lines + ([" ".join(notes), ""] if notes else [])


# --- GPU-side waste (`lab.measure.waste`) ----------------------------------------------------------------------------

WASTE_KINDS = ("strided block input", "strided linear input", "strided norm input", "strided attention input",
               "mask masks nothing", "grouped-query attention expanded by copies", "no repeated blocks")
_SHORT = {"strided block input": "blocks", "strided linear input": "linears", "strided norm input": "norms",
          "strided attention input": "attention"}


def waste_counts(waste: dict | None) -> dict[str, int]:
    """Calls per kind of site in one watched call."""
    out = {k: 0 for k in WASTE_KINDS}
    for s in (waste or {}).get("sites", []):
        out[s["kind"]] = out.get(s["kind"], 0) + s["count"]
    return out


def waste_lines(waste: dict | None, compiler: dict | None = None) -> list[str]:
    """Markdown: every site one watched call found, with its file and line and where a strided layout was made; the
    attention calls and, on a GPU, why a faster backend was refused; the compiler's warnings and graph breaks."""
    if not waste:
        return []
    lines = ["## GPU-side waste (one watched call, without fixes)", ""]
    sites = waste.get("sites", [])
    if sites:
        lines += ["| kind | calls | at | what | layout made at |", "|---|---|---|---|---|"]
        lines += [f"| {s['kind']} | {s['count']} | `{s['path']}:{s['line']}` {s['function']} | {s['detail']} | "
                  f"{'`' + s['origin'] + '`' if s.get('origin') else '—'} |" for s in sites]
    else:
        lines.append("No strided activation, mask that masks nothing, expanded grouped-query attention or missing "
                     "repeated blocks.")
    attention = waste.get("attention") or {}
    if attention:
        lines += ["", "Attention calls (by shape, dtype and mask):", ""]
        for signature, v in attention.items():
            said = "; ".join(f"{b}: {why}" for b, why in v.items() if b != "calls")
            lines.append(f"- {signature}: {v['calls']} calls" + (f" — {said}" if said else ""))
        if waste.get("backend_note"):
            lines.append(f"- {waste['backend_note']}.")
    if compiler:
        warned, breaks = compiler.get("warnings") or {}, compiler.get("graph_breaks") or {}
        lines += ["", "The compiler, in the first calls: "
                  + (f"{sum(breaks.values())} graph break(s)" if breaks else "no graph break")
                  + (f", {len(warned)} distinct warning(s)" if warned else ", no warning") + "."]
        lines += [f"- graph break ×{n}: {reason}" for reason, n in breaks.items()]
        lines += [f"- warning ×{n}: {text}" for text, n in warned.items()]
    return lines + [""]


def waste_row(name: str, waste: dict | None, work: dict | None) -> str | None:
    """A row of the census's waste table: strided inputs by consumer, masks, expanded GQA, repeated blocks, and, from
    the profiled call, the attention backend, the layout copies' share and the model FLOP utilisation."""
    if not waste:
        return None
    n = waste_counts(waste)
    strided = " / ".join(str(n[k]) for k in _SHORT)
    made = sorted({s["origin"].split(" (")[0] for s in waste.get("sites", []) if s.get("origin")
                   and s["kind"] in _SHORT})
    backend = layout = mfu = floor = "—"
    if work and "missing" not in work:
        backend = ", ".join(work.get("attention_backends") or {}) or "—"
        total = sum(v["us"] for v in work["by_class"].values())
        copy = work["by_class"].get("layout copy", {}).get("us", 0.0)
        layout = f"{100 * copy / total:.1f} %" if total else "—"
        roof = work.get("roofline") or {}
        # a summary without `cpu_step_us` held the host's step span as the step's time, which overstates the
        # utilisation where the host ran ahead of the device: it shows the bound the device work gives instead (on
        # one stream a step lasts at least as long as the work it launched)
        if "missing" not in roof and roof.get("mfu_pct") is not None and "cpu_step_us" in work:
            mfu = f"{roof['mfu_pct']:.1f} %"
        elif "missing" not in roof and work.get("flops_per_step") and total and work.get("per") == "step":
            mfu = f"≤ {100 * work['flops_per_step'] / (total * 1e-6) / (roof['peak_tflops'] * 1e12):.1f} %"
        over = total / roof["floor_us"] if "missing" not in roof and roof.get("floor_us") else None
        floor = f"{over:.2f}x" if over else "—"
    repeated = "missing" if n["no repeated blocks"] else "yes"
    return (f"| {name} | {strided} | {', '.join(f'`{m}`' for m in made) or '—'} | {n['mask masks nothing']} | "
            f"{n['grouped-query attention expanded by copies']} | {repeated} | {backend} | {layout} | {floor} | {mfu} |")


WASTE_HEADER = ["| pipeline | strided inputs: blocks / linears / norms / attention | layout made at | masks that mask "
                "nothing | GQA by copies | repeated blocks | attention backend | layout copies | device work over "
                "its floor | MFU |", "|---|---|---|---|---|---|---|---|---|---|"]

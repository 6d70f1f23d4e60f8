"""The page and the plot of a `lab history`: one row per release against the reference, and where the series steps.

A step is two consecutive measured releases whose intervals against the reference do not overlap: the call time
changed between them, by at least the gap between the intervals. That is conservative (two overlapping intervals
can still differ), and it points at the release that brought the change.
"""

from __future__ import annotations

import os
from pathlib import Path

from lab.base.naming import own_call
from lab.base.units import duration
from lab.pages import figure
from lab.pages.report import verdict_color
from lab.results.schema import Environment, HistoryResult, HistoryRow

LABELS = {
    "syncs": "syncs per call",
    "syncs_per_step": "syncs per step",
    "host_scalar_reads": "host scalar reads",
    "memcpy_HtoD": "H2D copies",
    "cpu_gaps_total_us": "CPU gaps",
    "gpu_idle_us": "GPU idle",
    "launches_per_step": "launches per step",
}


def _metric(row: HistoryRow, key: str) -> str:
    value = (row.metrics or {}).get(key, {}).get("test")
    if value is None:
        return "n/a"
    if key.endswith("_us"):
        return f"{value / 1e3:,.1f} ms"
    return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"


def interval(row: HistoryRow) -> tuple[list[float] | None, str]:
    """The interval a row's verdict was read off (`Stats.decided_interval` of `lab.results.schema`) and its level, or (None, "")
    where it is unbounded (a sequential design stopped after few blocks)."""
    ci = row.decided_ci or row.ci
    if not ci or ci[0] <= 0 or ci[1] == float("inf"):
        return None, ""
    return ci, row.decided_level or "95%"


def steps(rows: list[HistoryRow]) -> list[dict]:
    """Consecutive measured releases whose intervals against the reference (as :func:`interval`) do not overlap."""
    measured = [r for r in rows if interval(r)[0] or r.status == "reference"]
    out = []
    for before, after in zip(measured, measured[1:]):
        lo_b, hi_b = interval(before)[0] or (1.0, 1.0)
        lo_a, hi_a = interval(after)[0] or (1.0, 1.0)
        if lo_a > hi_b or hi_a < lo_b:
            change = after.ratio / before.ratio - 1
            out.append({"from": before.version, "to": after.version, "change": change,
                        "direction": "slower" if change > 0 else "faster"})
    return out


#: the counts of a call, exact where the trace is (a change between two releases is a change, not noise)
COUNTS = ("syncs", "syncs_per_step", "host_scalar_reads", "memcpy_HtoD")


def noisy(row: HistoryRow) -> list[str]:
    """The pair's warnings about its timings: spread, drift, bimodal arms (the first clause of each)."""
    marks = ("standard deviation is", "drift across blocks", "bimodal")
    return [w.split(";")[0].split(". ")[0] for w in row.warnings if any(m in w for m in marks)]


def count_changes(rows: list[HistoryRow]) -> list[dict]:
    """Consecutive measured releases (the reference included) whose sync, host read or copy counts differ."""
    measured = [r for r in rows if r.status not in ("skipped", "failed", "not reached")]
    out = []
    for before, after in zip(measured, measured[1:]):
        for key in COUNTS:
            a = (before.metrics or {}).get(key, {}).get("test")
            b = (after.metrics or {}).get(key, {}).get("test")
            if a is not None and b is not None and a != b:
                out.append({"from": before.version, "to": after.version, "metric": key,
                            "before": a, "after": b})
    return out


def markdown(history: HistoryResult, png_name: str | None = None, page_dir: Path | None = None) -> str:
    """The history page; with `page_dir` (where the page goes) each verdict links to its pair's A/B page."""
    rows = history.releases
    ref = history.reference["version"]
    lines = [f"# History of `{history.scenario}` over diffusers releases", "",
             f"{history.scenario} · {setting(history)} · {history.mode} · {history.steps} steps · "
             f"{_where(history.environment)}; every release against diffusers {ref}, each pair an "
             "A/B of two worker processes with the same scenario, seed and torch (ratio: release / reference, "
             "below 1 is faster; the interval is the one the verdict rests on: 95 %, or the 90 % equivalence interval "
             "where marked).", ""]
    keys = [k for k in LABELS if any(k in (r.metrics or {}) for r in rows)]
    lines += ["| diffusers | verdict | ratio [interval] | call | " + " | ".join(LABELS[k] for k in keys)
              + " | outputs |", "|---" * (5 + len(keys)) + "|"]
    for r in rows:
        if r.status in ("skipped", "failed", "not reached"):
            lines.append(f"| {r.version} | {r.status} | {r.why or ''} |" + " |" * (2 + len(keys)))
            continue
        ci, level = interval(r)
        shown = "reference" if r.status == "reference" else (
            f"{r.ratio:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]{'' if level.startswith('95') else ' (90%)'}" if ci else
            f"{r.ratio:.4f} [unbounded]" if r.ratio else "n/a")
        call = f"{r.test_ms:,.1f} ms" if r.test_ms else "n/a"
        outputs = "—" if r.status == "reference" else (
            "identical" if r.identical else f"max diff {r.max_abs_diff:.3g}" if r.max_abs_diff is not None
            else "n/a")
        verdict = "reference" if r.status == "reference" else r.words(history.config.margin) if r.verdict else ""
        link = (f"[{verdict}]({os.path.relpath(Path(r.result).with_suffix('.md'), page_dir)})"
                if r.result and page_dir is not None else verdict)
        if noisy(r):
            link += " (noisy)"
        if r.pairing == "one pair":
            link += " (one pair)"
        lines.append(f"| {r.version} | {link} | {shown} | {call} | "
                     + " | ".join(_metric(r, k) for k in keys) + f" | {outputs} |")
    lines.append("")
    one = [r.version for r in rows if r.pairing == "one pair"]
    if one:
        lines += [f"**Measured with one pair of worker processes** ({', '.join(one)}): each release's pair ran in the "
                  "same two processes for all its blocks, a design no calibration covers; any difference between "
                  "the two processes (memory layout, allocator state, thread placement) moved with its arm, so a "
                  "verdict marked (one pair) may be about the processes rather than the releases. Fresh pairs per "
                  "block (the default now) make that noise instead; the counts are not affected.", ""]
    found = steps(rows)
    if found:
        lines += ["Where the series steps (consecutive releases whose intervals do not overlap):", ""]
        lines += [f"- {s['from']} -> {s['to']}: {abs(s['change']) * 100:.1f} % {s['direction']}" for s in found]
    else:
        lines.append("No step between consecutive releases: every pair of neighbouring intervals overlaps.")
    lines.append("")
    flagged = [r for r in rows if noisy(r)]
    if flagged:
        lines += ["Noisy pairs (their call times spread, drift or split in two: a verdict among them is weaker than its "
                  "interval says, the counts are not affected):", ""]
        lines += [f"- {r.version}: " + "; ".join(noisy(r)) for r in flagged]
        lines.append("")
    changed = count_changes(rows)
    if changed:
        lines += ["Where the counts change (exact per call, from the profiled calls; the pair's A/B page names the "
                  "sites):", ""]
        lines += [f"- {c['from']} -> {c['to']}: {LABELS[c['metric']]} {_count(c['before'])} -> {_count(c['after'])}"
                  for c in changed]
        lines.append("")
    if png_name:
        lines += [f"![release history]({png_name})", ""]
    env = history.environment
    gpu = f", driver {env.driver}, CUDA {env.cuda}" if env.cuda else ""
    kept = [r.version for r in rows if r.status == "kept"]
    took = (f"{duration(history.seconds or 0)} in its last run, which kept the pairs of {', '.join(kept)} from an "
            "earlier one" if kept else f"{duration(history.seconds or 0)} in all")
    lines += [f"Environment: {_where(env)}{gpu}, torch {env.torch}, lab {env.lab_commit}; {took}.", "",
              f"Command: `{history.command}`", ""]
    return "\n".join(lines)


def setting(history: HistoryResult) -> str:
    """`full`, `full, 2 blocks, tiny call`: the size, the blocks kept and the call settings when not the size's own."""
    parts = [history.size]
    if history.layers:
        parts.append(f"{history.layers} blocks")
    call = history.call
    if call and call != own_call(history.size):
        parts.append(f"{call} call")
    return ", ".join(parts)


def _count(value: float) -> str:
    return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"


def _where(env: Environment) -> str:
    return env.gpu if env.cuda and env.gpu else f"CPU ({env.cpus} cores)"


def plot(history: HistoryResult, path: Path) -> Path | None:
    """Wall-clock ratio with its interval per release (top), syncs per call and GPU idle (bottom)."""
    rows = [r for r in history.releases if r.status not in ("skipped", "failed", "not reached") and r.ratio]
    if len(rows) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rows)))
    names = [r.version for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, 1.1 * len(rows)), 6), sharex=True,
                                      gridspec_kw={"height_ratios": [1.4, 1]})
    for i, r in zip(x, rows):
        lo, hi = interval(r)[0] or (r.ratio, r.ratio)
        top.errorbar([i], [r.ratio], yerr=[[r.ratio - lo], [hi - r.ratio]], fmt="o", capsize=4,
                     color=verdict_color(r.verdict))
    top.plot(x, [r.ratio for r in rows], color="grey", lw=0.8, alpha=0.6)
    top.axhline(1.0, color="grey", lw=1, ls="--")
    top.set_ylabel(f"call time / {history.reference['version']}")
    top.set_title(f"{history.scenario} ({setting(history)}, {history.mode}) over diffusers releases")
    def series(axis, key: str, color: str, label: str) -> None:
        values = [(r.metrics or {}).get(key, {}).get("test") for r in rows]
        if any(v is not None for v in values):
            scale = 1e3 if key.endswith("_us") else 1
            axis.plot([i for i, v in zip(x, values) if v is not None], [v / scale for v in values if v is not None],
                      "o-", color=color, label=label)

    series(bottom, "syncs", "tab:red", "syncs per call")
    series(bottom, "host_scalar_reads", "tab:orange", "host scalar reads")
    bottom.set_ylabel("per call")
    right = bottom.twinx()  # time on its own axis: GPU idle on a GPU, the CPU gaps everywhere
    series(right, "gpu_idle_us", "tab:blue", "GPU idle (ms)")
    series(right, "cpu_gaps_total_us", "tab:green", "CPU gaps (ms)")
    right.set_ylabel("ms per call")
    bottom.set_xticks(x, names)
    bottom.set_xlabel("diffusers")
    handles = bottom.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    if handles[0] or more[0]:
        bottom.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="best")
    fig.tight_layout()
    return figure.save(fig, path)

"""Presenting `lab sweep` results: the page of one sweep and its plot (the sweep itself runs in `lab.measure.sweep`)."""

from __future__ import annotations

from pathlib import Path

from lab import results
from lab.pages import figure
from lab.pages.report import interval_text
from lab.results.schema import SweepResult
from lab.verdicts.verdict import Verdict


def per_point_mode(regional: bool) -> str:
    """The `base_mode` of a compile-mode sweep: the mode varies, what is compiled does not."""
    return f"mode per point, {'regional' if regional else 'whole-transformer'} compile"


def setting(result: SweepResult) -> str:
    """How the sweep ran. Compile-mode sweeps written before they recorded what was compiled say only "mode per
    point": their command still says."""
    if result.base_mode == "mode per point":
        return per_point_mode("--no-compile-regional" not in result.command)
    return result.base_mode


def markdown(result: SweepResult, png_name: str | None) -> str:
    kept = results.layers(result)
    layers = f", {kept} transformer blocks" if kept else ""
    lines = [f"# Sweep: `{' + '.join(result.fixes)}` on `{result.scenario}` over `{result.key}`", "",
             f"{result.size}{layers} · {setting(result)} · {result.environment.gpu}", "",
             f"| {result.key} | verdict | wall clock per call (median) | test/control [interval decided on] | blocks | host scalar reads | syncs | GPU idle |",
             "|---|---|---|---|---|---|---|---|"]
    for p in result.points:
        s, m = p.stats, p.metrics or {}
        ratio = interval_text(s) if s else "n/a"

        def pair(k, scale=1.0, unit=""):
            if k not in m or m[k]["control"] is None:
                return "n/a"
            return f"{m[k]['control'] * scale:,.0f}{unit} -> {m[k]['test'] * scale:,.0f}{unit}"

        wall = f"{s.control_median:,.1f} -> {s.test_median:,.1f} ms" if s else "n/a"
        # a compile-mode sweep says how each point was compiled (regional or the whole transformer)
        shown = result.key == "compile" and p.mode not in (None, p.value)
        value = f"{p.value}: {p.mode}" if shown else p.value
        lines.append(f"| {value} | {p.verdict_text} | {wall} | {ratio} | {s.n if s else 'n/a'} | "
                     f"{pair('host_scalar_reads')} | {pair('syncs')} | {pair('gpu_idle_us', 1e-3, ' ms')} |")
    significant = [p.value for p in result.points if p.verdict.changed_speed]
    lines += ["", "Faster or slower at: " + (", ".join(map(str, significant)) if significant else "no point") + ".", ""]
    warned = [(p.value, w) for p in result.points for w in p.warnings]
    # torch's messages run over several lines; one bullet each
    warned += [(p.value, "failed: " + " ".join(p.summary.split())) for p in result.points if p.verdict is Verdict.FAILED]
    if warned:
        lines += ["Warnings:", ""] + [f"- {result.key} = {v}: {w}" for v, w in warned] + [""]
    if png_name:
        lines += [f"![effect against {result.key}]({png_name})", ""]
    lines += [f"Command: `{result.command}`", ""]
    return "\n".join(lines)


def plot(result: SweepResult, path: Path) -> Path | None:
    points = [p for p in result.points if p.stats]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(len(points)))
    med = [p.stats.ratio for p in points]
    cis = [p.stats.decided_interval()[0] for p in points]
    lo = [max(0.0, min(0.5, p.stats.ratio - ci[0])) for p, ci in zip(points, cis)]
    hi = [max(0.0, min(0.5, ci[1] - p.stats.ratio)) for p, ci in zip(points, cis)]
    colors = [p.verdict.color for p in points]
    ax.errorbar(xs, med, yerr=[lo, hi], fmt="none", ecolor="black", capsize=4, lw=1)
    ax.scatter(xs, med, c=colors, zorder=3)
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set_xticks(xs, [str(p.value) for p in points])
    ax.set_xlabel(result.key)
    ax.set_ylabel("test / control (estimate, interval decided on)")
    ax.set_title(f"{' + '.join(result.fixes)} on {result.scenario} ({result.size}); green faster, red slower, blue equivalent",
                 fontsize=9)
    fig.tight_layout()
    return figure.save(fig, path)

"""The page and plot of a settings map (`lab settings --pipeline`): every setting's peak GPU memory against its time
per call, upstream and with the catalog's fixes, the Pareto front marked, and for each memory budget the fastest way
to run the pipeline within it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lab.base import files
from lab.results.schema import SettingPoint, SettingsMapResult

#: the GPU memory budgets (GB) a page answers "the fastest within it" for: the cards users run
BUDGETS_GB = (8, 12, 16, 24, 32, 48, 80, 141)


def measured(points: Sequence[SettingPoint]) -> list[SettingPoint]:
    return [p for p in points if not p.error and p.call_ms is not None and p.peak_reserved_gb is not None]


def front(points: Sequence[SettingPoint]) -> list[SettingPoint]:
    """The Pareto front: each point no other point beats in both memory and time (less or equal in both, less in
    one), by increasing memory. Pure."""
    found = measured(points)
    out = [p for p in found
           if not any(q is not p and q.peak_reserved_gb <= p.peak_reserved_gb and q.call_ms <= p.call_ms
                      and (q.peak_reserved_gb < p.peak_reserved_gb or q.call_ms < p.call_ms) for q in found)]
    return sorted(out, key=lambda p: (p.peak_reserved_gb, p.call_ms))


def fastest_within(points: Sequence[SettingPoint], budget_gb: float) -> SettingPoint | None:
    """The fastest point whose peak reserved memory fits `budget_gb`, or None. Pure."""
    fits = [p for p in measured(points) if p.peak_reserved_gb <= budget_gb]
    return min(fits, key=lambda p: p.call_ms) if fits else None


def budget_table(maps: Sequence[tuple[Path, SettingsMapResult]], root: Path) -> list[str]:
    """The fastest point within each GPU memory budget (`fastest_within`), one column per committed map (`maps`: its
    path and result; links relative to `root`), a map cut short marked so (its answers hold among the settings it
    measured). [] without maps."""
    if not maps:
        return []
    heads = [f"[{r.scenario}]({path.with_suffix('.md').relative_to(root).as_posix()}), {r.environment.gpu or r.environment.device}"
             + (" (partial)" if r.interrupted else "") for path, r in maps]
    lines = ["| GPU memory | " + " | ".join(heads) + " |", "|---|" + "---|" * len(maps)]
    for budget in BUDGETS_GB:
        row = []
        for _, r in maps:
            p = fastest_within(r.points, budget)
            row.append(f"`{p.setting}`{' + fixes' if p.arm == 'fixed' else ''}: {p.call_ms / 1e3:,.2f} s, "
                       f"{p.peak_reserved_gb:,.1f} GB" if p is not None else "nothing measured fits")
        lines.append(f"| {budget} GB | " + " | ".join(row) + " |")
    return lines


def for_memory(results_dir: Path) -> list[str]:
    """Which setting to run for a GPU memory budget, per pipeline: the fastest point of each committed settings map
    within it (`lab settings --pipeline`), upstream or with the fixes."""
    from lab import results

    maps = results.all_results(results_dir / "settings-map", kind="settings-map")
    if not maps:
        return []
    return ["## Which setting for your GPU memory", "",
            "The fastest way to run each pipeline within a GPU memory budget, from its settings map (`lab settings "
            "--pipeline NAME`: every memory and speed setting on one build, upstream and with the catalog's fixes, "
            "true size, its peak memory reserved by torch's allocator, which the card holds besides the CUDA context, against "
            "its time per call); *+ fixes* is the setting with the catalog's fixes that apply in it. A map marked "
            "partial was cut short: its answers hold among the settings it measured. Each point rests on a few "
            "calls, not on an A/B: where two points differ by less than their calls' spread (the pages give each "
            "call), either will do. Times hold on the host each page names, at its copy rates.", "",
            *budget_table(maps, results_dir), ""]


def _name(p: SettingPoint) -> str:
    return f"`{p.setting}`" + (" with the fixes" if p.arm == "fixed" else " upstream")


def markdown(result: SettingsMapResult, png_name: str | None = None) -> str:
    env = result.environment
    rates = env.copy_rates or {}
    lines = [f"# Which setting for `{result.scenario}`? Memory against time", "",
             f"{result.size} size" + (f", {result.layers} transformer blocks" if result.layers else ", every block")
             + f", {result.steps} steps; {env.gpu or env.device}, torch {env.torch}, diffusers {env.diffusers}"
             + (f", accelerate {env.accelerate}" if env.accelerate else "") + ". "
             + (f"Weights {result.weights_gb:,.1f} GB. " if result.weights_gb else "")
             + ("The host's pinned copy rates"
                + (", as the map's latest process measured them" if result.went_on else "")
                + f": {rates['h2d_pinned']:g} GB/s to the device, {rates['d2h_pinned']:g} GB/s back (pageable: "
                f"{rates['h2d_pageable']:g} and {rates['d2h_kept_pageable']:g}); every limit below is read at them."
                if rates else "")
             + (f" The host's memory: {env.host_memory_gb:,.0f} GB." if env.host_memory_gb else "")
             + (" Each measuring process's first call, with nothing on and timed for no point: "
                + ", ".join(f"{ms:,.1f} ms" for ms in result.first_calls_ms) + "."
                if result.first_calls_ms else ""), "",
             "How to read it: each setting runs on the same build, upstream and with the catalog's fixes that apply in "
             "it; *peak* is the most GPU memory torch's allocator reserved during its calls (what the card must "
             "hold besides the CUDA context), *call* the median wall time of its calls, *host peak* the most host "
             "memory the process held over the point (pinned copies included, the weights it holds anyway too), and "
             "*limit* its call over the overlap limit of its copies and compute (1.00x: as fast as the host's copy "
             "rates allow). Points on the Pareto front (nothing is both smaller and faster) are in bold.", ""]
    best = [(b, fastest_within(result.points, b)) for b in BUDGETS_GB]
    answers = [f"- with {b} GB: {_name(p)}, {p.call_ms / 1e3:,.2f} s per call ({p.peak_reserved_gb:,.1f} GB)"
               for b, p in best if p is not None]
    if result.interrupted:  # the answers hold among the points measured, which a setting not yet measured may beat
        settings = sorted({p.setting for p in result.points if not p.error})
        lines += [f"**A partial map:** it was cut short before its last point (`lab settings --resume` goes on from "
                  f"it), so the answers below are the fastest among the {len(settings)} setting(s) measured so far ("
                  + ", ".join(f"`{t}`" for t in settings) + ").", ""]
    if answers:
        lines += ["The fastest way to run it here, by the GPU memory you have:", "", *answers, ""]
    on_front = {id(p) for p in front(result.points)}
    lines += ["| setting | arm | fixes | call | peak reserved | peak allocated | host peak "
              "| copied to / from the device | limit |", "|---|---|---|---|---|---|---|---|---|"]
    for p in result.points:
        host = f"{p.host_peak_gb:,.1f} GB" if p.host_peak_gb is not None else ""
        if p.error:
            lines.append(f"| `{p.setting}` | {p.arm} | {', '.join(p.fixes) or '-'} | failed: {p.error} | | | {host} | "
                         "| |")
            continue
        bold = "**" if id(p) in on_front else ""
        copied = (f"{p.h2d_bytes / 1e9:,.2f} / {p.d2h_bytes / 1e9:,.2f} GB" if p.h2d_bytes is not None else "")
        limit = f"{p.offload['multiple']:.2f}x" if p.offload else ""
        peak = f"{bold}{p.peak_reserved_gb:,.1f} GB{bold}" if p.peak_reserved_gb is not None else "n/a"
        alloc = f"{p.peak_allocated_gb:,.1f} GB" if p.peak_allocated_gb is not None else "n/a"
        lines.append(f"| `{p.setting}` | {p.arm} | {', '.join(p.fixes) or '-'} | {bold}{p.call_ms:,.1f} ms{bold} | "
                     f"{peak} | {alloc} | {host or 'n/a'} | {copied} | {limit} |")
    lines += where_time_goes(result.points) + host_in_idle(result.points)
    notes = [f"- `{p.setting}`, {p.arm}: {p.note}" for p in result.points if p.note]
    if notes:
        lines += ["", *notes]
    if result.interrupted:
        lines += ["", "Interrupted: the settings after the last row were not measured."]
    if png_name:
        lines += ["", f"![peak GPU memory against time per call]({png_name})"]
    lines += ["", f"Command: `{result.command}`", ""]
    return "\n".join(lines)


def obstacle_of(p: SettingPoint) -> dict | None:
    """What holds an offloaded point above its overlap limit (`lab.verdicts.offload_limit.obstacle`), where it
    stores its limit and its profiled call's device split; else None."""
    from lab.verdicts.offload_limit import OffloadLimit, obstacle

    if not (p.offload and p.device and p.device.get("profiled_ms")):
        return None
    fields = ("call_ms", "compute_ms", "h2d_bytes", "d2h_bytes", "h2d_gbs", "d2h_gbs")
    limit = OffloadLimit(**{k: (int(p.offload[k]) if k.endswith("bytes") else p.offload[k]) for k in fields})
    return obstacle(limit, p.device, p.device["profiled_ms"])


def where_time_goes(points: Sequence[SettingPoint]) -> list[str]:
    """The section on where each offloaded call's time goes (the points that stored their device split), and for
    each one past `AT_LIMIT` its overlap limit what holds it there."""
    from lab.verdicts.offload_limit import AT_LIMIT, OBSTACLES

    rows = [(p, o) for p in points if not p.error for o in [obstacle_of(p)] if o is not None]
    if not rows:
        return []
    lines = ["", "Where an offloaded call's time goes, from its profiled call (device activity only): *kernels* is the "
             "time some kernel ran, *copies* the time some copy ran (*alone*: beside no kernel), *idle* the time the "
             "device had nothing to do (the host was behind), and *to the device* the rate its copies reached while "
             f"they ran. For a call past {AT_LIMIT}x its limit, *what holds it* is the largest part of the call past "
             "that limit (`lab.verdicts.offload_limit.obstacle`): where the copies bound the limit, copies slower than "
             "the pinned rate, compute beside no copy, or idle; where the compute does, kernels slower than without "
             "offloading, copies beside no kernel, or idle.", "",
             "| setting | arm | profiled call | kernels | copies (alone) | idle | to the device | limit | what holds it |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p, o in rows:
        reached = o["reached_gbs"]["HtoD"]
        held = OBSTACLES[o["largest"]] if p.offload["multiple"] > AT_LIMIT else "(at its limit)"
        alone = p.device["exposed_us"] / 1e3
        lines.append(f"| `{p.setting}` | {p.arm} | {o['profiled_ms']:,.0f} ms | {o['kernels_ms']:,.0f} ms | "
                     f"{o['copies_ms']:,.0f} ms ({alone:,.0f} ms) | {o['parts_ms']['idle']:,.0f} ms | "
                     + (f"{reached:,.1f} GB/s" if reached else "-") + f" | {p.offload['multiple']:.2f}x | {held} |")
    return lines


def plot(result: SettingsMapResult, path: Path) -> Path | None:
    """Peak reserved memory (x) against time per call (y, log), upstream hollow and fixed filled, the front joined."""
    found = measured(result.points)
    if not found:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from lab.pages.figure import save

    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    colors = {}
    for p in found:
        c = colors.setdefault(p.setting, f"C{len(colors) % 10}")
        ax.scatter(p.peak_reserved_gb, p.call_ms / 1e3, s=60, color=c if p.arm == "fixed" else "none",
                   edgecolors=c, linewidths=1.5, label=p.setting if p.arm == "upstream" or p.setting not in
                   [q.setting for q in found if q.arm == "upstream"] else None, zorder=3)
    line = front(result.points)
    ax.step([p.peak_reserved_gb for p in line], [p.call_ms / 1e3 for p in line], where="post", color="black",
            linewidth=1, alpha=0.6, zorder=2, label="Pareto front")
    ax.set_yscale("log")
    # seconds as numbers (20, not 2 x 10^1), between the powers of ten at 2, 3 and 5 only, lest they crowd
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else ""))
    ax.set_xlabel("peak GPU memory reserved (GB)")
    ax.set_ylabel("time per call (s, log)")
    ax.set_title(f"{result.scenario}: each setting upstream (hollow) and with the catalog's fixes (filled)")
    ax.grid(True, which="both", alpha=0.3)
    # beside the axes, not on them: a setting's point can lie anywhere in the plot, the legend would hide it
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return save(fig, path, tight=True)


def write_result(result: SettingsMapResult, folder: Path) -> Path:
    """The result alone (`<name>.json`), whole or not at all: a map stored as it grows, its page written at its end
    (`--resume` goes on from a map a killed process left)."""
    from lab import results

    path = (folder / result.name).with_suffix(".json")
    results.write(path, result, replace=True)
    return path


def write(result: SettingsMapResult, folder: Path) -> dict[str, Path]:
    """The result, its page and its plot in `folder` (`<scenario>__<device>.{json,md,png}`), each whole or not at all;
    the result first, so that a failing plot loses nothing."""
    stem = folder / result.name
    paths = {"json": write_result(result, folder), "md": stem.with_suffix(".md"), "png": stem.with_suffix(".png")}
    png = plot(result, paths["png"])
    files.write_text(paths["md"], markdown(result, png.name if png else None))
    return paths


def host_in_idle(points: Sequence[SettingPoint]) -> list[str]:
    """The section on what the host did while the device sat idle, for the points that took a host trace (`lab
    settings --host-trace`): the idle gaps of that call, the callers with the most inclusive time in them and the
    functions with the most self time."""
    rows = [p for p in points if not p.error and p.host_in_idle]
    if not rows:
        return []
    lines = ["", "What the host did while the device sat idle, from one more call profiled with the host's Python "
             "functions (`--host-trace`, which slows that call: it is timed for nothing): the device's idle gaps over "
             "100 µs in it, the callers with the most time in them (callees included) and the functions with the "
             "most time of their own (`lab.traces.gaps`).", "",
             "| setting | arm | host-traced call | idle (gaps) | callers | functions |", "|---|---|---|---|---|---|"]
    for p in rows:
        h = p.host_in_idle
        callers = "; ".join(f"`{c['function']}` {c['inclusive_ms']:,.0f} ms" for c in h["callers"][:3]) or "-"
        functions = "; ".join(f"`{f['function']}` {f['self_ms']:,.0f} ms" for f in h["functions"][:3]) or "-"
        lines.append(f"| `{p.setting}` | {p.arm} | {h['call_ms']:,.0f} ms | {h['idle_ms']:,.0f} ms ({h['gaps']}) | "
                     f"{callers} | {functions} |")
    return lines

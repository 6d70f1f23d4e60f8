"""Presenting `lab census`: the page of one pipeline (every arm, and which fix removes what) and the census table
over all pipelines (the census itself runs in `lab.measure.census`)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from lab.apply.fix import census_lacks
from lab.pages import figure
from lab.pages.work_report import WASTE_HEADER, waste_lines, waste_row, work_rows
from lab.results.schema import CensusArm, CensusResult


def changed_sites(base: CensusArm, arm: CensusArm) -> list[tuple[str, int, int]]:
    """The sites whose count changed from `base` to `arm`: (`function (path)`, before, after), largest drop first."""
    before = {(s["path"], s["function"]): s["count"] for s in base.sites}
    after = {(s["path"], s["function"]): s["count"] for s in arm.sites}
    keys = before.keys() | after.keys()
    changed = [(f"{fn} ({path})", before.get((path, fn), 0), after.get((path, fn), 0)) for path, fn in keys
               if before.get((path, fn), 0) != after.get((path, fn), 0)]
    return sorted(changed, key=lambda c: (c[2] - c[1], c[0]))


def loop_sites(arm: CensusArm) -> dict[str, int]:
    """The sites that still sync (read) inside the denoising loop, with their counts per call."""
    return {f"`{s['function']}` ({s['path']})": s["phases"]["in loop"] for s in arm.sites
            if s["phases"].get("in loop")}


def _copies(arm: CensusArm) -> str:
    return "n/a (CPU)" if arm.htod is None else f"{arm.htod} / {arm.dtoh}"


def _gaps(arm: CensusArm) -> str:
    return "n/a" if arm.cpu_gaps_ms is None else f"{arm.cpu_gaps_ms:,.1f} (max {arm.cpu_gap_max_ms:,.1f})"


def _idle(arm: CensusArm) -> str:
    """GPU idle inside the loop: none on a CPU, nor in a census measured before it was recorded."""
    return "—" if arm.gpu_idle_loop_ms is None else f"{arm.gpu_idle_loop_ms:,.1f}"


def _fillers(arm: CensusArm) -> str:
    return ", ".join(f"`{f['function']}` {f['self_ms']:,.1f} ms" for f in arm.gap_fillers) or "nothing recorded"


def _setting(result: CensusResult) -> str:
    layers = f", {result.layers} blocks" if result.layers else ""
    settings = f", in {'; '.join(result.settings)}" if result.settings else ""
    return f"{result.size}{layers}, {result.mode}, {result.steps} steps{settings}"


def count_noun(result: CensusResult) -> str:
    """What the census counts: syncs on a GPU, host scalar reads on a CPU (also for a result that failed before its
    first arm, which has no `what`)."""
    if result.what:
        return "syncs" if result.what.startswith("sync") else "host scalar reads"
    return "host scalar reads" if result.environment.device == "cpu" else "syncs"


def verdict(result: CensusResult) -> str:
    """Whether the denoising loop is free of syncs (reads) with the catalog's fixes, and what remains if not."""
    if result.interrupted:
        return f"interrupted after {len(result.arms)} arm(s): `lab census` again measures it"
    if result.error:  # the traceback's file was on the machine that ran it: the page keeps it, the table does not
        return f"failed: {result.error.split(' Full traceback: ')[0]}"
    arm = result.all_fixes or result.baseline
    if arm is None:
        return "no arm completed"
    remaining = loop_sites(arm)
    base = result.baseline
    if not remaining:
        return "sync-free loop" + ("" if base is None or not base.in_loop or arm is base else " with the fixes")
    parts = []
    for site, n in sorted(remaining.items(), key=lambda kv: -kv[1]):
        # a fix left out of the joint set (it rewrites the same code as another) may remove what the set leaves
        other = [a.fixes[0] for a in result.arms if len(a.fixes) == 1 and a.fixes[0] not in arm.fixes
                 and loop_sites(a).get(site, 0) < n]
        parts.append(f"{site} ×{n}" + (f" (fewer with {', '.join(other)}, which cannot join the others)" if other else ""))
    return "remains: " + ", ".join(parts)


def markdown(result: CensusResult) -> str:
    env = result.environment
    noun = count_noun(result)
    lines = [f"# Census: `{result.scenario}` ({_setting(result)})", "",
             f"{env.gpu}; torch {env.torch}, diffusers {env.diffusers}. Counting {result.what or noun}; the lab's own "
             "at the call boundaries are left out.", ""]
    if result.interrupted:
        lines += [f"**Interrupted** after {len(result.arms)} arm(s) (a Ctrl-C or a time limit): what completed is "
                  "below; `lab census` again measures the pipeline afresh.", ""]
    elif result.error:
        lines += [f"**Failed:** {result.error}", ""]
    if result.arms:
        lines += [f"| fixes | {noun} per call | in loop per step | first step | before / after loop | host scalar reads "
                  "| HtoD / DtoH copies | CPU gaps between transformer calls (ms) | GPU idle in the loop (ms) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for a in result.arms:
            lines.append(f"| {', '.join(a.fixes) or 'none'} | {a.per_call} | {a.in_loop_per_step:.2f} | {a.first_step} | "
                         f"{a.before_loop} / {a.after_loop} | {a.scalar_reads} | {_copies(a)} | {_gaps(a)} | "
                         f"{_idle(a)} |")
        if any(a.gap_fillers for a in result.arms):
            lines += ["", "## What the host ran in the CPU gaps", "",
                      "The functions with the most self time between transformer calls, over the profiled call:", ""]
            lines += [f"- {', '.join(a.fixes) or 'none'}: {_fillers(a)}" for a in result.arms]
        base = result.baseline
        if base is not None:
            lines += ["", "## Sites without fixes", "", "| site | per call | phases | per step |", "|---|---|---|---|"]
            for s in base.sites:
                lines.append(f"| `{s['function']}` ({s['path']}) | {s['count']} | "
                             f"{', '.join(f'{k}: {v}' for k, v in s['phases'].items())} | "
                             f"{', '.join(f'{k}: {v}' for k, v in s['per_step'].items()) or '—'} |")
            fixed = [a for a in result.arms if a.fixes]
            if fixed:
                lines += ["", "## What each fix removes", ""]
                for a in fixed:
                    changes = changed_sites(base, a)
                    what = "; ".join(f"{site}: {b} -> {n}" for site, b, n in changes) or "no site changes"
                    lines.append(f"- **{', '.join(a.fixes)}**: {base.per_call} -> {a.per_call} per call. {what}.")
                joint = result.all_fixes.fixes
                if len(joint) > 1 and not any(len(a.fixes) == 1 and a.fixes[0] in joint for a in fixed):
                    lines += ["", "Measured without fixes and with all of them only (`lab census --arms ends`): which "
                                  "fix removes what is on the census of the same pipeline and setting in eager mode, "
                                  "or in one measured with `--arms each`."]
    base = result.baseline
    if base is not None and base.work:
        fixed = result.all_fixes or base
        lines += ["", "## Where the device time goes", "", "Without fixes -> with every applicable fix:", ""]
        lines += work_rows(base.work, fixed.work)
    lines += [""] + waste_lines(result.waste, result.compiler)
    lines += [f"Loop: {verdict(result)}."]
    if owed := census_lacks(result):
        one = len(owed) == 1
        lines += ["", f"**Measured before the catalog had {', '.join(f'`{n}`' for n in owed)}**, which "
                      f"{'applies' if one else 'apply'} to this pipeline: run the command below again (`lab census` "
                      f"measures such a pipeline again) for what {'it removes' if one else 'they remove'}."]
    if result.skipped:
        lines += ["", "Not applied:", ""] + [f"- {note}" for note in result.skipped]
    lines += ["", f"Command: `{result.command}`", ""]
    return "\n".join(lines)


def setting_of(path: Path) -> str:
    """`eager__full-2l__h100` of `wan__eager__full-2l__h100.json`: the part of a census page's name its table shares."""
    return path.stem.split("__", 1)[1]


def _plain_key(path: Path, r: CensusResult) -> tuple[Path, str, str, str] | None:
    """What a census page shares with the same census without a setting: its folder, mode, size (and the diffusers
    it asked for) and device."""
    from lab.base.naming import size_tag

    parts = path.stem.split("__")  # <pipeline>__<mode>__<size and settings>__<device>
    if len(parts) != 4:
        return None
    return path.parent, parts[1], size_tag(r.size, r.layers, steps=r.steps, diffusers=r.diffusers), parts[3]


def pages(found: Sequence[tuple[Path, CensusResult]]) -> dict[Path, str]:
    """Every census page and table as `lab census` writes them, from the result JSONs (`lab table` rewrites them)."""
    out = {path.with_suffix(".md"): markdown(r) for path, r in found}
    tables: dict[Path, list[CensusResult]] = {}
    plain: dict[tuple, dict[str, CensusResult]] = {}
    for path, r in found:
        tables.setdefault(path.with_name(f"census__{setting_of(path)}.md"), []).append(r)
        if not r.settings and (key := _plain_key(path, r)):
            plain.setdefault(key, {})[r.scenario] = r
    for path, rs in tables.items():
        setting = next((r for r in rs if r.settings), None)
        key = _plain_key(path.with_name(f"{setting.scenario}__{setting_of(path)}.json"), setting) if setting else None
        out[path] = table(rs, plain.get(key))
    return out


def table(found: Sequence[CensusResult], plain: dict[str, CensusResult] | None = None) -> str:
    """The census over pipelines: one row each, without and with the fixes, and what remains in the loop. In a
    setting, `plain` (the same census without a setting, by pipeline) gives what the setting adds."""
    if not found:
        return "# Census\n\nNo pipeline measured yet.\n"
    first = next((r for r in found if not r.error), found[0])  # a failed pipeline may lack what the heading says
    env = first.environment
    noun = count_noun(first)
    lines = [f"# Census ({_setting(first)}, {env.gpu})", "",
             f"torch {env.torch}, diffusers {env.diffusers}. Per pipeline: {noun} per call without fixes -> with every "
             "applicable fix of the catalog, the same inside the denoising loop per step, in the first step, before "
             "and after the loop; host scalar reads; host-to-device / device-to-host copies per call; host time "
             "between consecutive transformer calls; GPU idle inside the loop (— on a CPU, or measured before the "
             "census recorded it). Each pipeline's own page lists the sites, which fix removes what and what the host "
             "ran in the gaps, and the command that measured it.", "",
             f"| pipeline | {noun} per call | in loop per step | first step | before / after loop | host scalar reads "
             "| HtoD / DtoH | CPU gaps (ms) | GPU idle in loop (ms) | fixes applied | loop |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pair(a: CensusArm | None, b: CensusArm | None, value) -> str:
        if a is None:
            return "—"
        x = value(a)
        return x if b is None or b is a or value(b) == x else f"{x} -> {value(b)}"

    for r in sorted(found, key=lambda r: r.scenario):
        base, fixed = r.baseline, r.all_fixes
        link = f"[{r.scenario}]({r.name}.md)"
        if base is None:
            lines.append(f"| {link} | — | — | — | — | — | — | — | — | — | {verdict(r)} |")
            continue
        lines.append(
            f"| {link} | {pair(base, fixed, lambda a: str(a.per_call))} | "
            f"{pair(base, fixed, lambda a: f'{a.in_loop_per_step:.2f}')} | {pair(base, fixed, lambda a: str(a.first_step))} | "
            f"{pair(base, fixed, lambda a: f'{a.before_loop} / {a.after_loop}')} | "
            f"{pair(base, fixed, lambda a: str(a.scalar_reads))} | {pair(base, fixed, _copies)} | "
            f"{pair(base, fixed, _gaps)} | {pair(base, fixed, _idle)} | "
            f"{', '.join(fixed.fixes) if fixed else 'none applies'} | {verdict(r)}"
            + (f" (measured before the catalog had {', '.join(owed)})" if (owed := census_lacks(r)) else "") + " |")
    failed = [r for r in found if r.error and not r.interrupted]
    stopped = [r.scenario for r in found if r.interrupted]
    free = [r.scenario for r in found if not r.error and r.baseline and not r.baseline.in_loop]
    made = [r.scenario for r in found if not r.error and r.baseline and r.baseline.in_loop and r.all_fixes
            and not r.all_fixes.in_loop]
    remain = [r.scenario for r in found if not r.error and r.baseline and (r.all_fixes or r.baseline).in_loop]
    lines += ["", f"- Loop free of {noun} as shipped: {', '.join(free) or 'none'}.",
              f"- Made free by the catalog's fixes: {', '.join(made) or 'none'}.",
              f"- Still with {noun} in the loop: {', '.join(remain) or 'none'}."]
    if failed:
        lines.append(f"- Failed: {', '.join(r.scenario for r in failed)} (each one's page says why).")
    if stopped:
        lines.append(f"- Interrupted, to be measured again: {', '.join(stopped)}.")
    lines += _added(found, plain or {}, noun)
    waste = [row for r in sorted(found, key=lambda r: r.scenario)
             if (row := waste_row(f"[{r.scenario}]({r.name}.md)", r.waste, r.baseline.work if r.baseline else None))]
    if waste:
        lines += ["", "## GPU-side waste", "",
                  "Per pipeline, without fixes, from one watched call (`lab.measure.waste`): calls in which a block, a "
                  "linear, a norm or an attention was fed a layout that costs a copy, and the lines that made the "
                  "layout; attention masks that mask nothing; grouped-query attention expanded by copies; whether "
                  "the denoiser names repeated blocks (regional compilation). From the profiled call: the attention "
                  "backend that ran, the layout copies' share of the device time per step, the device work of a step over "
                  "the time its FLOPs and bytes would take at the GPU's ceilings (the roofline's floor), and the step's "
                  "model FLOP utilisation (a GPU with shapes only; a bound, ≤, where the census held the host's step "
                  "span as the step's time, which overstates it where the host runs ahead: the step's FLOPs over its "
                  "device work at the peak rate, as a step lasts at least as long as the work it launched). Each pipeline's page lists the sites with their "
                  "file and line.", "", *WASTE_HEADER, *waste]
    return "\n".join(lines) + "\n"


def _added(found: Sequence[CensusResult], plain: dict[str, CensusResult], noun: str) -> list[str]:
    """What a setting adds inside the loop, per step, against the same pipeline's census without it."""
    rows = []
    for r in sorted(found, key=lambda r: r.scenario):
        q = plain.get(r.scenario)
        if not r.settings or r.error or not r.baseline or q is None or not q.baseline:
            continue
        step = [(a.in_loop_per_step, b.in_loop_per_step) for a, b in ((q.baseline, r.baseline),
                                                                      (q.all_fixes or q.baseline,
                                                                       r.all_fixes or r.baseline))]
        rows.append(f"- [{r.scenario}]({q.name}.md): {step[0][0]:.2f} -> {step[0][1]:.2f} per step without fixes "
                    f"({step[0][1] - step[0][0]:+.2f}), {step[1][0]:.2f} -> {step[1][1]:.2f} with every applicable "
                    f"fix ({step[1][1] - step[1][0]:+.2f}); {q.baseline.per_call} -> {r.baseline.per_call} per call "
                    "without fixes.")
    if not rows:
        return []
    return ["", f"What the setting adds: {noun} inside the loop per step, the pipeline's census without a setting "
                "(linked) -> in this setting.", "", *rows]


def _setting_label(r: CensusResult) -> str:
    return "; ".join(r.settings) if r.settings else "no setting"


def settings_groups(found: Sequence[tuple[Path, CensusResult]],
                    everything: bool = False) -> dict[Path, list[CensusResult]]:
    """The census results of one mode, size and device measured in more than one setting (`--setting`, or none), by
    the plot they make (`census__eager__full-2l__h100__settings.png` beside the tables); only the pipelines measured
    in at least two of those settings. Without `everything` no result that has nothing to draw (one that failed or
    was refused, or with no fix that applies); with it those too, for a table that says so."""
    groups: dict[Path, list[CensusResult]] = {}
    for path, r in found:
        key = _plain_key(path, r)
        if key is None or not (everything or _drawable(r)):
            continue
        folder, mode, size, device = key
        groups.setdefault(folder / f"census__{mode}__{size}__{device}__settings.png", []).append(r)
    out = {}
    for path, rs in groups.items():
        settings = {p: {_setting_label(r) for r in rs if r.scenario == p and _drawable(r)}
                    for p in {r.scenario for r in rs}}
        kept = [r for r in rs if len(settings[r.scenario]) > 1]
        if kept:
            out[path] = kept
    return out


def _drawable(r: CensusResult) -> bool:
    return not r.error and r.baseline is not None and r.all_fixes is not None


def settings_table(rs: Sequence[CensusResult]) -> list[str]:
    """One row per setting, one column per pipeline: the syncs (host scalar reads on a CPU) inside the denoising loop
    per step without fixes -> with every applicable fix, and per call the same; what a setting adds is its row
    against the row without one. A pipeline that could not take a setting says so in its cell."""
    pipelines = sorted({r.scenario for r in rs})
    labels = sorted({_setting_label(r) for r in rs}, key=lambda s: (s != "no setting", s))
    lines = [f"| setting | {' | '.join(f'`{p}`' for p in pipelines)} |", "|---|" + "---|" * len(pipelines)]
    for label in labels:
        mine = {r.scenario: r for r in rs if _setting_label(r) == label}
        lines.append(f"| {label} | " + " | ".join(_table_cell(mine.get(p)) for p in pipelines) + " |")
    return lines


def _table_cell(r: CensusResult | None) -> str:
    if r is None:
        return "—"
    if r.interrupted:
        return "interrupted"
    if r.error:  # a refusal before the build is the lab's `--setting ...` line; anything else failed while measured
        return "refused" if r.error.startswith("`--setting") else f"failed ({r.error.split(':')[0]})"
    if r.baseline is None:
        return "—"
    base, fixed = r.baseline, r.all_fixes or r.baseline
    step = (f"{base.in_loop_per_step:.2f}" if fixed is base else
            f"{base.in_loop_per_step:.2f} -> {fixed.in_loop_per_step:.2f}")
    call = str(base.per_call) if fixed is base else f"{base.per_call} -> {fixed.per_call}"
    return f"{step} ({call})"


def settings_plot(rs: Sequence[CensusResult], path: Path) -> Path:
    """Two heat maps side by side, one row per setting and one column per pipeline: the syncs (host scalar reads on a
    CPU) per step inside the denoising loop without fixes, and with every applicable fix. What a setting adds per
    step is its row against the row without one; what the fixes leave, the right map against the left. A log colour
    scale, since the offload settings count hundreds where the rest count none or a few; an empty cell: not measured
    in that setting."""
    first = rs[0]
    key = figure.key(settings_plot, [(r.scenario, _setting_label(r), r.baseline.in_loop_per_step,
                                      (r.all_fixes or r.baseline).in_loop_per_step) for r in rs],
                     count_noun(first), first.size, first.layers, first.mode, first.environment.gpu)
    if figure.current(path, key):
        return Path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import SymLogNorm

    pipelines = sorted({r.scenario for r in rs})
    labels = sorted({_setting_label(r) for r in rs}, key=lambda s: (s != "no setting", s))
    maps = {name: np.full((len(labels), len(pipelines)), np.nan) for name in ("baseline", "all_fixes")}
    for r in rs:
        at = (labels.index(_setting_label(r)), pipelines.index(r.scenario))
        maps["baseline"][at] = r.baseline.in_loop_per_step
        maps["all_fixes"][at] = (r.all_fixes or r.baseline).in_loop_per_step
    top = max(1.0, float(np.nanmax(maps["baseline"])), float(np.nanmax(maps["all_fixes"])))
    norm = SymLogNorm(linthresh=1.0, vmin=0.0, vmax=top)
    cmap = matplotlib.colormaps["Reds"].copy()
    cmap.set_bad("#f4f4f4")
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.5 * len(pipelines), 1.6 + 0.34 * len(labels)), sharey=True)
    for ax, (name, title) in zip(axes, (("baseline", "without fixes"), ("all_fixes", "with every applicable fix"))):
        image = ax.imshow(maps[name], cmap=cmap, norm=norm, aspect="auto")
        for (y, x), value in np.ndenumerate(maps[name]):
            if not np.isnan(value):
                ax.text(x, y, f"{value:.2f}".rstrip("0").rstrip("."), ha="center", va="center", fontsize=7,
                        color="white" if norm(value) > 0.6 else "black")
        ax.set_xticks(range(len(pipelines)), pipelines, fontsize=8, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(range(len(labels)), [textwrap.fill(label, 48) for label in labels], fontsize=7)
    noun = count_noun(first)
    fig.colorbar(image, ax=axes, fraction=0.03, pad=0.02).set_label(f"{noun} per step in the loop", fontsize=8)
    fig.suptitle(f"Census in the settings users run: {noun} per step inside the denoising loop "
                 f"({first.size}{f', {first.layers} blocks' if first.layers else ''}, {first.mode.split(' ')[0]}, "
                 f"{first.environment.gpu or 'CPU'})", fontsize=9)
    return figure.save(fig, path, tight=True, key=key)

"""Presenting A/B results: the before/after markdown table and the plot (computation lives elsewhere)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from lab import results
from lab.base import files
from lab.pages import figure, limits_report
from lab.pages.work_report import work_rows
from lab.results.schema import ABResult, Stats
from lab.verdicts import stats
from lab.verdicts.verdict import Verdict


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f} ms" if v >= 100 else f"{v:,.2f} ms"


def _us(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 1000:,.1f} ms" if abs(v) >= 10_000 else f"{v:,.0f} µs"


def _num(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.2f}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v):,}"


def spread(values: list[float]) -> str:
    """`median ± MAD-based spread` of a sample, in ms."""
    if not values:
        return "n/a"
    return f"{stats.median(values):,.1f} ± {1.4826 * stats.mad(values):,.1f} ms"


def describe(result) -> str:
    """One line: scenario, size, mode, steps, the settings it ran in and where (an A/B or a sweep)."""
    env = result.environment
    where = env.gpu if env.gpu and "CPU" not in env.gpu else f"CPU ({env.cpus} cores)"
    steps = f" · {result.steps} steps" if getattr(result, "steps", None) else ""
    setting = "".join(f" · setting {s}" for s in getattr(result, "settings", None) or ())
    other = f" · diffusers {result.on_diffusers}" if getattr(result, "on_diffusers", None) else ""
    decoded = " · decoded to images or video" if getattr(result, "decoded", False) else ""
    return f"{result.scenario} · {result.size} · {result.mode}{steps}{decoded}{setting}{other} · {where}"


def _pair(m: dict, key: str, fmt) -> tuple[str, str]:
    """Each arm's value (the median over the profiled calls) and, where the calls differed, their range."""
    def one(arm: str) -> str:
        lo_hi = m[key].get(f"{arm}_range")
        return fmt(m[key][arm]) + (f" ({fmt(lo_hi[0])}–{fmt(lo_hi[1])})" if lo_hi else "")

    return one("control"), one("test")


def trace_rows(prof: dict, on_gpu: bool) -> list[tuple[str, str, str]]:
    """Rows from the paired profiles. Device-only metrics (syncs, copies, GPU idle) only for GPU runs."""
    m, rows = prof["metrics"], []
    if on_gpu:
        rows.append(("syncs per call", *_pair(m, "syncs", _num)))
        if m["syncs_per_step"]["control"] is not None:
            rows.append(("syncs per step (in steps)", *_pair(m, "syncs_per_step", _num)))
        rows.append(("host blocked in syncs", *_pair(m, "sync_blocked_us", _us)))
    rows.append(("host scalar reads", *_pair(m, "host_scalar_reads", _num)))
    if on_gpu:
        rows.append(("H2D / D2H copies", *(f"{m['memcpy_HtoD'][a]} / {m['memcpy_DtoH'][a]}" for a in ("control", "test"))))
    fn = {arm: prof["regions"][arm]["functions"].get("hooks.py:_set_context") for arm in ("control", "test")}
    if fn["control"] and fn["control"].get("count"):
        rows.append(("`_set_context` total", *(f"{_us(fn[a]['total_us'])} over {fn[a]['count']} calls" for a in ("control", "test"))))
    gaps = prof["cpu_gaps_us"]
    if gaps["control"] is not None:
        def show(g):
            return " / ".join(f"{x:,.0f}" for x in g[:3]) + (" …" if len(g) > 3 else "") + " µs"

        rows.append(("CPU gaps between transformer calls", show(gaps["control"]), show(gaps["test"])))
        rows.append(("CPU gaps, total", *_pair(m, "cpu_gaps_total_us", _us)))
    if on_gpu and m["gpu_idle_us"]["control"] is not None:
        rows.append(("GPU idle (whole call)", *_pair(m, "gpu_idle_us", _us)))
        if m["gpu_idle_denoise_us"]["control"] is not None:
            rows.append(("GPU idle (denoising loop)", *_pair(m, "gpu_idle_denoise_us", _us)))
    if on_gpu and m["launches_per_step"]["control"] is not None:
        rows.append(("launches per step", *_pair(m, "launches_per_step", _num)))
    compiled = prof.get("compile") or {}
    if compiled.get("control", {}).get("compiled"):
        g = {a: compiled[a]["guards"] for a in ("control", "test")}
        rows.append(("guard evaluation per call", *(f"{_us(g[a]['per_pipeline_call_us'])} over {g[a]['lookups']} lookups"
                                                    for a in ("control", "test"))))
        rows.append(("launches outside compiled regions", *(f"{compiled[a]['launches']['outside_share']:.1%}"
                                                            for a in ("control", "test"))))
    return rows


def _idle_caveat(idle: dict) -> str:
    """How far to trust a GPU idle difference: one profiled call per arm is noisy (one control's idle moved by more
    than ten times from call to call: FINDINGS), and overlapping ranges over several calls mean the difference is
    within their spread."""
    c, t = idle.get("control_range"), idle.get("test_range")
    if not c or not t:
        return " It rests on one profiled call per arm, which is noisy."
    if c[0] <= t[1] and t[0] <= c[1]:
        return " The arms' ranges over the profiled calls overlap: the difference is within their spread."
    return ""


def time_accounting(result: ABResult) -> str | None:
    """One paragraph that sets what the trace says the fix can win next to what the clock measured: the GPU idle
    the fix removed bounds what removing host stalls can save, while host time blocked in a sync while the GPU is
    busy does not shorten the call. None without a GPU profile and timing."""
    if not results.on_gpu(result) or not result.profile or not result.stats:
        return None
    m, s = result.profile["metrics"], result.stats
    idle, blocked = m.get("gpu_idle_us") or {}, m.get("sync_blocked_us") or {}
    if idle.get("control") is None or idle.get("test") is None:
        return None
    call = s.control_median
    removed = (idle["control"] - idle["test"]) / 1e3
    most = max(idle["control"], idle["test"]) / 1e3
    if most > call:  # more idle in a profiled call than the whole timed call: the profiler's cost dominates
        return (f"Where the time went: a profiled call's GPU idle ({most:,.1f} ms) exceeds the whole timed control "
                f"call ({call:,.1f} ms): the profiler's own overhead dominates these profiles, so they say nothing "
                "about how much of the call a fix could win.")
    if removed >= 0:
        text = (f"Where the time went: the fix removed {removed:,.1f} ms of GPU idle per call in the profiled calls "
                f"({removed / call:.2%} of the {call:,.1f} ms control call), the most that removing host stalls can "
                "win here; fewer or cheaper kernels would add to it.")
    else:
        text = (f"Where the time went: GPU idle per call grew by {-removed:,.1f} ms in the profiled calls "
                f"({-removed / call:.2%} of the {call:,.1f} ms control call).")
    text += _idle_caveat(idle)
    if blocked.get("control") is not None and blocked.get("test") is not None:
        text += (f" Host time blocked in syncs changed by {(blocked['test'] - blocked['control']) / 1e3:+,.1f} ms: "
                 "waiting for GPU work already queued, which does not shorten the call.")
    gained, lo, hi = (call * (1 - r) for r in (s.ratio, s.ci[1], s.ci[0]))
    text += (f" Measured: {gained:,.1f} ms saved per call ({s.level} CI {lo:,.1f} to {hi:,.1f} ms). The "
             "profiler slows the host, so the profiled calls' GPU idle is generous as a bound.")
    if removed >= 0 and lo > removed:  # the clock saved more than any host stall could have cost
        copies = [f"{m[key]['control']:,.0f} -> {m[key]['test']:,.0f} {words}" for key, words in
                  (("memcpy_HtoD", "host-to-device"), ("memcpy_DtoH", "device-to-host"))
                  if isinstance(m.get(key), dict) and m[key].get("test") is not None
                  and m[key].get("control") is not None and m[key]["test"] < m[key]["control"]]
        text += (f" The clock saved more than that bound (at least {lo:,.1f} ms per call): the fix also took GPU work "
                 "out of the call" + (f" (copies per call: {' and '.join(copies)})" if copies else "") + ".")
    return text


def metric_rows(result: ABResult) -> list[tuple[str, str, str]]:
    """(metric, before, after) rows: syncs, host reads, `_set_context`, CPU gaps, GPU idle, launches, wall clock."""
    rows = []
    if result.profile:
        rows += trace_rows(result.profile, results.on_gpu(result))
    if result.timed:
        rows.append(("wall clock per call (median ± 1.4826·MAD)", spread(result.samples.control.wall_ms),
                     spread(result.samples.test.wall_ms)))
    st = result.step_times or {}
    if "control" in st and "test" in st:
        rows.append(("per-step time (median, steps 0..)", *(", ".join(f"{x:,.1f}" for x in st[a]) + " ms" for a in ("control", "test"))))
    return rows


def title(result: ABResult) -> str:
    """What a result compares: its fixes, two diffusers, or A/A."""
    return result.title


def write_ab(result: ABResult, paths: dict[str, Path], replace: bool) -> None:
    """An A/B result with its page and plot (the result first: it is never lost to a failing plot)."""
    results.write(paths["json"], result, replace=replace)
    png = plot(result, paths["png"])
    if png is None and paths["png"].exists():  # a replaced result's plot: it showed blocks this result does not hold
        paths["png"].unlink()
    files.write_text(paths["md"], markdown(result, png.name if png else None))


def decision_sentence(decisions: dict[str, dict[str, int]]) -> str:
    """`The setting's decisions from the data, in each arm's verifying call (transformer calls): control:
    first_block_cache computed 8, skipped 0; test: ...`: whether a cache skipped at all (with random weights it may
    not)."""
    def arm(counts: dict[str, int]) -> str:
        by_setting: dict[str, list[str]] = {}
        for key, n in counts.items():
            setting, _, what = key.partition(": ")
            by_setting.setdefault(setting, []).append(f"{what} {n}")
        return "; ".join(f"{setting} " + ", ".join(parts) for setting, parts in by_setting.items())

    arms = "; ".join(f"{name}: {arm(counts)}" for name, counts in decisions.items())
    return f"The setting's decisions from the data, in each arm's verifying call (transformer calls): {arms}."


def markdown(result: ABResult, png_name: str | None = None) -> str:
    lines = [f"# `{title(result)}` on `{result.scenario}`", "", f"{describe(result)}", "",
             f"**Verdict: {result.verdict_text}** — {result.summary}", ""]
    lines += process_lines(result)
    lines += change_lines(result)
    v = result.verify
    if v is not None and v.max_abs_diff is not None:
        # beyond the tolerance stays bold where nothing else accepted the difference (the compiler's rounding, the
        # reference)
        within = {"within the tolerance": "within", "outputs differ": "**beyond**"}.get(v.equality, "beyond")
        same = "bit-identical" if v.identical else (
            f"max |diff| {v.max_abs_diff:.3g}, {within} the tolerance {v.tolerance:g}")
        if v.numerics is not None:  # not bit-identical: the reference says whether it is rounding
            same += f"; {numerics_sentence(v.numerics)}"
        changed = v.lines or {}
        ran = ", ".join(f"`{k}` ran {n} time(s)" for k, n in v.exercised.items() if k not in changed)
        ran += "".join(f"{', ' if ran or i else ''}`{k}`: {c.ran} of its {c.changed} changed line(s) ran"
                       for i, (k, c) in enumerate(changed.items()))
        lines += [f"Outputs with the same seed: {same}. " + (f"Changed code: {ran}." if ran else ""), ""]
        if v.kept_from:
            lines += [f"The verification is kept from the run of {v.kept_from}, which this one goes on from: "
                      "compiled, its warm-up alone had compiled what the blocks run (nothing compiled in the "
                      "verifying calls after it), so verifying again would only repeat it.", ""]
        if v.decisions:
            lines += [decision_sentence(v.decisions), ""]
        if v.compiler_rounding is not None:
            r = v.compiler_rounding
            lines += [f"Compiled, the outputs differ by more than the tolerance; run eagerly they differ by "
                      f"{r.eager_diff:.3g}, and compiling moves each arm's output from its eager one by "
                      f"{r.control_compiled_vs_eager:.3g} (control) and {r.test_compiled_vs_eager:.3g} (test): "
                      + ("the difference is the compiler's own rounding, and the arms count as equal."
                         if r.accepted else "the difference is more than the compiler's rounding"
                         + ("; held against the reference above, it is rounding all the same." if v.numerics is not None
                            and v.numerics.accepted else ", so the fix changes results.")), ""]
        for k, c in changed.items():
            if c.not_run:
                lines += [f"Changed lines of `{k}` that did not run in the call:", "", "```",
                          *c.not_run, "```", ""]
    rows = metric_rows(result)
    if rows:
        lines += ["| metric | before | after |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows] + [""]
        lines += fewer_profiles_lines(result.profile)
    accounting = time_accounting(result)
    if accounting:
        lines += [accounting, ""]
    work = (result.profile or {}).get("work") or {}
    lines += work_rows(work.get("control"), work.get("test"), step_ms=mean_step_ms(result))
    lines += site_lines(result)
    lines += moved_lines(result)
    if result.stats:
        lines += [statistics_sentence(result), ""]
    lines += limits_report.bound_lines(result)
    lines += limits_report.offload_lines(result)
    lines += compilation_lines(result)
    lines += checklist_lines(result)
    for w in result.warnings:
        lines.append(f"- warning: {w}")
    if result.warnings:
        lines.append("")
    if png_name:
        lines += [f"![distributions and per-block ratios]({png_name})", ""]
    env = result.environment
    lines += [f"Environment: {env.gpu}, driver {env.driver}, CUDA {env.cuda}, torch {env.torch}, "
              f"diffusers {env.diffusers}" + (f", accelerate {env.accelerate}" if env.accelerate else "")
              + f", lab {env.lab_commit}.", "", *limits_report.copy_rates_lines(env), f"Command: `{result.command}`", ""]
    return "\n".join(lines + segment_lines(result))


def mean_step_ms(result: ABResult) -> dict[str, float] | None:
    """Each arm's mean step time in the timed calls (the medians per step), without the profiler."""
    st = result.step_times or {}
    out = {}
    for arm in ("control", "test"):
        steps = [x for x in st.get(arm) or () if x is not None]
        if steps:
            out[arm] = sum(steps) / len(steps)
    return out or None


def numerics_sentence(n) -> str:
    """Both arms against the reference of higher precision, and what the rule made of them."""
    if n.control_error is None:
        return f"no reference check ({n.reason})"
    verdict = "**numerically equivalent**" if n.accepted else "**outputs differ**"
    return (f"against a {n.reference} reference of the same weights and noise, the control's relative error is "
            f"{n.control_error:.3g} and the test arm's {n.test_error:.3g} (accepted up to {n.bound:.3g}): {verdict}, "
            f"{n.reason}")


def fewer_profiles_lines(profile: dict | None) -> list[str]:
    """Why the trace metrics rest on fewer profiled calls than were asked for, where they do."""
    if not profile or profile.get("calls", 0) >= profile.get("calls_wanted", 0):
        return []
    why = ("the run was interrupted in its profiles" if profile.get("cut_short") else
           "no more fitted before the campaign's time limit")
    return [f"The trace metrics rest on {profile['calls']} profiled call(s) per arm of the "
            f"{profile['calls_wanted']} asked for: {why}.", ""]


def process_lines(result: ABResult) -> list[str]:
    """How the arms' worker processes were paired over the blocks, for a cross-process result."""
    design = result.process_design
    if design is None:
        return []
    w = result.workers
    if design == "one pair":
        return ["Worker processes: **one pair for all blocks** (uncalibrated): each arm ran in one process for the "
                "whole comparison, so any difference between the two processes (memory layout, allocator state, "
                "thread placement) moved with its arm and is part of this ratio; fresh pairs per block make it "
                "noise instead (`lab ab` without `--one-pair`).", ""]
    cost = f", {w.start_s_median:.1f} s each to start, build and warm up" if w.start_s_median is not None else ""
    if w.at_once:
        cost = (f"; the pairs of {w.at_once} blocks built side by side ahead of their blocks, idle until then"
                + (f", {w.unused} processes unused when it decided" if w.unused else "")
                + (f"; a block waited {w.start_s_median:.1f} s for its pair (median)" if w.start_s_median is not None
                   else ""))
    return [f"Worker processes: a fresh pair for every block ({w.pairs} pairs, {w.processes} processes, started "
            f"in alternating order{cost}): a difference between processes is noise between blocks, not a bias.", ""]


def segment_lines(result: ABResult) -> list[str]:
    """Which runs measured the blocks of a result that went on from an earlier one (`lab ab --resume`)."""
    runs = result.segments or []
    if not runs:
        return []
    out = [f"The blocks were measured in {len(runs)} runs (`--resume`), one design throughout:", ""]
    first = 1
    for run in runs:
        last = first + run.blocks - 1
        # (the last run may have measured none: stopped at a time limit before a block would end; it read
        # "blocks 7-6")
        which = "no block" if not run.blocks else f"block {first}" if last == first else f"blocks {first}-{last}"
        median = f", control median {run.control_median_ms:,.1f} ms" if run.control_median_ms else ""
        driver = f", driver {run.driver}" if run.driver else ""
        cpus = (f", a host of {run.cpus} CPUs" if run.cpus else "") + (
            f" measuring {run.host_jobs} campaign jobs at once" if run.host_jobs else "")
        out.append(f"- {which}: {run.created}, {run.stopped}{median}{driver}{cpus}, lab {run.lab_commit}: "
                   f"`{run.command}`")
        first = last + 1
    return out + [""]


def change_lines(result: ABResult) -> list[str]:
    """Where the test arm's code came from, when it is not (only) the catalog: diffs, or another diffusers."""
    out = []
    patches = result.patches
    if patches:
        out.append(f"Change: {', '.join(f'`{p}`' for p in patches['paths'])} (sha256 {patches['sha256'][:12]}), applied "
                   f"in memory to {', '.join(f'`{m}`' for m in patches['modules'])}"
                   + (f"; skipped: {'; '.join(patches['skipped'])}" if patches["skipped"] else "") + ".")
    if result.base:
        out.append(base_line(result))
    versions = result.diffusers
    if versions:
        out.append(f"Control: diffusers {versions['control']['version']} ({versions['control']['origin']}); test: "
                   f"diffusers {versions['test']['version']} ({versions['test']['origin']}); each arm in a worker "
                   "process of its own, with the same scenario, seed and torch.")
    return out + ([""] if out else [])


def base_line(result: ABResult) -> str:
    """What each arm ran in an A/B over a base (`lab ab --base`), as the result records it (`arms`): the base in
    both, the tested fixes on top in the test arm, in place of a base fix they conflict with."""
    line = (f"Over a base: {', '.join(f'`{b}`' for b in result.base)} on in both arms; the test arm adds "
            f"{', '.join(f'`{f}`' for f in result.fixes)}, so the ratio is what they add over the base")
    replaced = [b for b in result.base if result.arms and b not in result.arms.get("test", [])]
    if replaced:
        line += f" (in the test arm they replace {', '.join(f'`{b}`' for b in replaced)}, with which they conflict)"
    return line + "."


def site_lines(result: ABResult, top: int = 10) -> list[str]:
    """The Python call sites whose syncs or host scalar reads changed between the arms (per call, first pair)."""
    prof = result.profile or {}
    rows = [("sync", site, c["control"], c["test"]) for site, c in (prof.get("sync_sites") or {}).items()
            if c["control"] != c["test"]]
    reads = prof.get("host_read_sites") or {}
    before, after = reads.get("control") or {}, reads.get("test") or {}
    rows += [("host scalar read", site, before.get(site, 0), after.get(site, 0)) for site in {**before, **after}
             if before.get(site, 0) != after.get(site, 0)]
    if not rows:
        return []
    rows.sort(key=lambda r: -abs(r[3] - r[2]))
    return ["Where the syncs and host scalar reads changed (by the Python function that made them, named by the file "
            "and line where it starts; first profiled pair):",
            "", "| kind | site | before | after |", "|---|---|---|---|",
            *[f"| {kind} | `{site}` | {a:,} | {b:,} |" for kind, site, a, b in rows[:top]], ""]


def moved_lines(result: ABResult, top: int = 8) -> list[str]:
    """Where the saving came from: the functions whose host time in the gaps (CPU gaps between transformer calls,
    GPU idle gaps) moved most between the arms, in the first profiled pair."""
    moved = [m for m in ((result.profile or {}).get("gap_functions") or []) if abs(m["delta_us"]) >= 1][:top]
    if not moved:
        return []
    return ["Where the host time in the gaps went (time inside each function, callees included, over every gap; "
            "first profiled pair):", "",
            "| gaps | function | before | after | change |", "|---|---|---|---|---|",
            *[f"| {m['source']} | `{m['function']}` | {_us(m['control_us'])} | {_us(m['test_us'])} | "
              f"{'+' if m['delta_us'] > 0 else ''}{_us(m['delta_us'])} |" for m in moved], ""]


def compilation_lines(result: ABResult) -> list[str]:
    """The compiler's account of both arms (compile mode): compilations, graph breaks, recompiles, guards."""
    c = result.compilation
    if not c:
        return []

    def breaks(part: dict) -> str:
        sites = "; ".join(f"{s['where']} ({s['reason']}){' x' + str(s['count']) if s['count'] > 1 else ''}"
                          for s in part["graph_break_sites"])
        return f"{part['graph_breaks']}" + (f": {sites}" if sites else "")

    # the verification's own column where the result kept it (older results counted its compilations nowhere)
    parts = ("control", "test", "verify", "steady") if c.get("verify") else ("control", "test", "steady")
    rows = [("compilations", *(f"{c[p]['compilations']}" for p in parts)),
            ("graph breaks", *(breaks(c[p]) for p in parts)),
            ("recompiles", *(f"{c[p]['recompiles']}" + ("".join(f"; {r['guard']}" for r in c[p]["recompile_reasons"][:2]))
                             for p in parts)),
            ("guards", *(f"{c[p]['guards']}" for p in parts)),
            ("compile time", *(f"{c[p]['compile_s']:.1f} s" for p in parts))]
    heads = {"control": "control, first calls", "test": "test, first calls", "verify": "verification",
             "steady": "every later call"}
    lines = ["Compilation (the compiler's structured log, `TORCH_TRACE`): what each arm's first calls compiled, "
             + ("what the verifying calls compiled, " if "verify" in parts else "") + "and anything compiled after "
             "them.", "", "| | " + " | ".join(heads[p] for p in parts) + " |", "|---" * (len(parts) + 1) + "|",
             *["| " + " | ".join(row) + " |" for row in rows], ""]
    findings = [n for n in c["notes"] if n.startswith("finding:")]
    lines += [f"- {n}" for n in findings] + ([""] if findings else [])
    return lines


def checklist_lines(result: ABResult) -> list[str]:
    """The guide's quick checklist for both arms (from the first profiled pair)."""
    lists = ((result.profile or {}).get("checklist")) or {}
    if not lists:
        return []
    lines = ["The profiling guide's quick checklist (first profiled pair):", "",
             "| question | control | test | healthy when |", "|---|---|---|---|"]
    for c, t in zip(lists["control"], lists["test"]):
        lines.append(f"| {c['question']} | {c['value']} ({c['verdict']}) | {t['value']} ({t['verdict']}) | {c['threshold']} |")
    return lines + [""]


def statistics_sentence(result: ABResult) -> str:
    """How the verdict was reached: the design, the estimate and both intervals, and why the blocks stopped."""
    s = result.stats
    design = s.design
    how = ("a fixed design" if design["kind"] == "fixed" else
           f"a sequential design (looks from block {design['min_blocks']} to {design['max_blocks']}, "
           f"{_STOPPED.get(result.stopped, 'stopped')})")
    text = (f"Statistics over {s.n} interleaved blocks, {how}: test/control {s.ratio:.4f} (Hodges-Lehmann "
            f"estimate of the per-block ratio), {s.level} CI {_ci(s.ci)} for faster/slower, "
            f"{s.level_equivalence} CI {_ci(s.ci_equivalence)} for equivalence within ±{s.margin * 100:g}%")
    if s.p_signed_rank is not None:
        text += f"; signed-rank p = {s.p_signed_rank:.3g}"
    return text + f"; Mann-Whitney U (unpaired) p = {s.p_mann_whitney:.3g}."


_STOPPED = {"decided": "stopped when it decided", "bounded": "no block timed: the trace's bound decided", "max blocks": "stopped at the most blocks allowed",
            "budget spent": "stopped when the time budget was spent", "interrupted": "interrupted",
            "time limit": "stopped before the campaign's time limit",
            "blocks done": "all blocks run", "not exercised": "stopped after one block: no fix's code ran"}


def _ci(ci) -> str:
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci[0] > 0 and ci[1] < float("inf") else "unbounded"


def interval_text(s: Stats, digits: int = 4) -> str:
    """`0.9960 [0.9931, 0.9985] (95%)`: the estimate and the interval its verdict was read off."""
    ci, level = s.decided_interval()
    shown = f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci[0] > 0 and ci[1] < float("inf") else "unbounded"
    return f"{s.ratio:.{digits}f} {shown} ({level.split(' (')[0]})"


def verdict_color(verdict: Verdict | None) -> str:
    """green faster, red slower, blue equivalent, grey undecided (and every other verdict)."""
    return verdict.color if verdict is not None else Verdict.UNDECIDED.color


def plot(result: ABResult, path: Path) -> Path | None:
    """Both arms' wall-clock distributions and the per-block ratios with the bootstrap CI."""
    if not result.timed:
        return None
    samples = result.samples
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, t = samples.control.wall_ms, samples.test.wall_ms
    ratios = stats.paired_ratios(c, t)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1, 1.4]})
    ax1.boxplot([c, t], showfliers=False)
    ax1.set_xticks([1, 2], ["control", "test"])
    for i, values in enumerate((c, t), start=1):
        ax1.scatter([i + (j % 5 - 2) * 0.04 for j in range(len(values))], values, s=12, alpha=0.7)
    ax1.set_ylabel("wall clock per call (ms)")
    ax1.set_title("per-call time")
    blocks = range(1, len(ratios) + 1)
    ax2.plot(blocks, ratios, "o-", ms=4, lw=1)
    ax2.axhline(1.0, color="grey", lw=1, ls="--")
    s = result.stats
    if s and s.ci[0] > 0 and s.ci[1] < float("inf"):
        ax2.axhspan(s.ci[0], s.ci[1], color="tab:blue", alpha=0.15, label=f"{s.level} CI (decided on)")
        ax2.axhline(s.ratio, color="tab:blue", lw=1.5, label=f"estimate {s.ratio:.4f}")
    looks = result.looks or []
    if looks:  # the sequential interval after each look: the run stops where it leaves 1 or fits the margin
        n = [lk.n for lk in looks]
        ax2.plot(n, [lk.ci[0] for lk in looks], color="tab:purple", lw=1, ls=":", label="interval at each look")
        ax2.plot(n, [lk.ci[1] for lk in looks], color="tab:purple", lw=1, ls=":")
    if s:
        ax2.axhspan(1 - s.margin, 1 + s.margin, color="grey", alpha=0.08, label=f"±{s.margin * 100:g}%")
        ax2.legend(loc="best", fontsize=7)
    ax2.set_xlabel("block")
    ax2.set_ylabel("test / control")
    ax2.set_title(f"per-block ratio — {result.verdict_text}")
    fig.suptitle(textwrap.fill(f"{title(result)}: {describe(result)}", 150), fontsize=9)  # a setting's is long
    fig.tight_layout()
    return figure.save(fig, path)


def forest_plot(items: list[tuple[str, ABResult]], path: Path) -> Path | None:
    """Every A/B result as one row: its test/control estimate with the interval it was decided on, coloured by the
    verdict (green faster, red slower, blue equivalent, grey undecided). `items` are (label, result)."""
    rows = [(label, r) for label, r in items if r.stats]
    if not rows:
        return None
    key = figure.key(forest_plot, [(label, r.verdict.color, r.stats.ratio, r.stats.decided_interval()[0])
                                   for label, r in rows])
    if figure.current(path, key):
        return Path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = sum(label.count("\n") + 1 for label, _ in rows)
    fig, ax = plt.subplots(figsize=(12, 0.24 * lines + 0.1 * len(rows) + 1.4))
    for y, (label, r) in enumerate(reversed(rows)):
        s = r.stats
        color = r.verdict.color
        lo, hi = s.decided_interval()[0]
        if lo > 0 and hi < float("inf"):
            ax.plot([lo, hi], [y, y], color=color, lw=2, solid_capstyle="butt")
            ax.plot([s.ratio], [y], "o", color=color, ms=4)
        else:  # too few blocks for any interval: the estimate alone, hollow
            ax.plot([s.ratio], [y], "o", mfc="none", color=color, ms=4)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)], fontsize=7)
    ax.set_xlabel("test / control, wall clock per call (estimate and the interval decided on); below 1 = faster",
                  fontsize=8)
    ax.set_title("green faster, red slower, blue equivalent within the margin, grey undecided", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return figure.save(fig, path, tight=True, key=key)  # the canvas grows to fit the long labels

"""`lab hunt`: every host-device sync of a pipeline call, found two ways and merged into one list of sync sites.

1. The profiler with Python stacks: each sync call (and, on a CPU-only run, each host scalar read) attributed to the
   innermost user-code frame, with its blocked time, its step and its phase (before, in or after the loop).
2. CUDA sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`), which names the exact line of the op that
   synced but is known to miss some syncs (and exists only on CUDA).

The merged sites are matched against the static candidates of `lab scan` in the same files: which candidates were
hit at run time, and which runtime sites the scan missed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from lab.base.console import routed_warnings
from lab.base.paths import package_parent, trim_path
from lab.measure.scan import Finding, diffusers_root, scan
from lab.pages.work_report import waste_lines, work_table
from lab.results.schema import HuntResult
from lab.run.profile import ProfileOptions, profile_call
from lab.run.runner import timed_call
from lab.run.scenario import Built, resolve
from lab.traces.timeline import SYNC_CALLS, Frames, loop_begin, loop_step_of, steps
from lab.traces.trace import Trace, load

_SITE = re.compile(r"^(?P<path>.+?)(?: \[lab fix: [^\]]+\])?:(?P<line>\d+) (?P<func>\S+)$")
_HARNESS = ("lab/",)


@dataclasses.dataclass
class Site:
    path: str
    function: str
    def_line: int | None = None
    lines: set[int] = dataclasses.field(default_factory=set)  # exact lines from sync debug mode
    profiler_count: int = 0
    debug_count: int = 0
    blocked_us: float = 0.0
    per_step: dict[str, int] = dataclasses.field(default_factory=dict)
    phases: dict[str, int] = dataclasses.field(default_factory=dict)
    static: list[str] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.path, self.function.rsplit(".", 1)[-1]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lines"] = sorted(self.lines)
        return d


def _phase(t: int, spans: list[tuple[int, int, int]], begin: int | None = None) -> str:
    if not spans:
        return "call"
    if t < (spans[0][1] if begin is None else begin):
        return "before loop"
    if t >= spans[-1][2]:
        return "after loop"
    return "in loop"


def profiler_sites(trace_path: Path | Trace, device: str,
                   frames: Frames | None = None) -> tuple[dict[tuple[str, str], Site], str, int]:
    """Sync sites from a trace (host scalar reads instead on a CPU-only run), and the number of denoising steps in it."""
    trace = trace_path if isinstance(trace_path, Trace) else load(trace_path)
    frames = frames if frames is not None else Frames(trace)
    spans = steps(trace)
    if device.startswith("cuda"):
        events = trace.cat("cuda_runtime").named(*SYNC_CALLS)
        kind = "sync calls (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy)"
    else:
        events = trace.cat("cpu_op").named("aten::_local_scalar_dense")
        kind = "host scalar reads (aten::_local_scalar_dense): a CPU-only run has no device syncs"
    begin = loop_begin(trace, spans)
    idx = loop_step_of(events.ts, spans, begin)
    sites: dict[tuple[str, str], Site] = {}
    for t, dur, i in zip(events.ts.tolist(), events.dur.tolist(), idx.tolist()):
        frame = frames.user_frame(int(t)) if frames else None
        m = _SITE.match(frame or "")
        if m is None:
            path, func, line = "(no Python stack)", "?", None
        else:
            path, func, line = m["path"], m["func"], int(m["line"])
        site = sites.setdefault((path, func), Site(path, func, line))
        site.profiler_count += 1
        site.blocked_us += dur / 1000.0
        if i >= 0:
            site.per_step[str(i)] = site.per_step.get(str(i), 0) + 1
        phase = _phase(int(t), spans, begin)
        site.phases[phase] = site.phases.get(phase, 0) + 1
    return sites, kind, len(spans)


def sync_warning_capture(records: list[list[traceback.FrameSummary]]):
    """Collect the Python stack of every "called a synchronizing CUDA operation" warning; show the others."""
    def take(message: str, filename: str) -> bool:  # noqa: ARG001 - `routed_warnings`' signature
        if "synchroniz" not in message:
            return False
        records.append(traceback.extract_stack()[:-2])  # without this function and `show`
        return True

    return routed_warnings(take)


@contextlib.contextmanager
def sync_debug_capture(records: list[list[traceback.FrameSummary]]):
    """CUDA sync debug mode ("warn") for the duration, with the stack of each warning collected."""
    previous_mode = torch.cuda.get_sync_debug_mode()
    with sync_warning_capture(records):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)


_STDLIB = sysconfig.get_paths()["stdlib"]
_LAB = (package_parent() / "lab").as_posix() + "/"


def _user_frame(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame outside torch, the lab and the standard library (the warning machinery runs there)."""
    for frame in reversed(stack):
        f = frame.filename.replace("\\", "/")
        stdlib = frame.filename.startswith(_STDLIB) and "-packages" not in f
        # the lab's own package, not any path with a `lab` folder in it (a diffusers unpacked in the lab's cache)
        if "/torch/" in f or f.startswith(_LAB) or f.startswith("<") or stdlib:
            continue
        return frame
    return None


def debug_sites(built: Built, seed: int) -> tuple[list[dict], str | None]:
    """Run one call under CUDA sync debug mode; the sites it names (file:line, function)."""
    if not built.device.startswith("cuda"):
        return [], "CUDA sync debug mode needs a CUDA device; this run lists the profiler's sites only"
    records: list[list[traceback.FrameSummary]] = []
    with sync_debug_capture(records):
        timed_call(built, seed=seed, marks=False)
    return debug_records(records), None


def debug_records(records: list[list[traceback.FrameSummary]]) -> list[dict]:
    """The user-code frame (path as the profiler names it, line, function) of each captured sync warning."""
    out = []
    for stack in records:
        frame = _user_frame(stack)
        if frame is not None:
            out.append({"path": trim_path(frame.filename), "line": frame.lineno, "function": frame.name})
    return out


def merge(sites: dict[tuple[str, str], Site], debug: list[dict]) -> list[Site]:
    by_key = {s.key: s for s in sites.values()}
    for d in debug:
        path = d["path"].split(" [lab fix")[0]
        key = (path, d["function"])
        site = by_key.get(key)
        if site is None:
            site = by_key[key] = Site(path, d["function"])
        site.debug_count += 1
        site.lines.add(d["line"])
    return sorted(by_key.values(), key=lambda s: (-s.profiler_count - s.debug_count, s.path))


def match_static(merged: list[Site], findings: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """Attach static candidates to the runtime sites of the same file and function; return (hit, not hit)."""
    hit, missed = [], []
    keyed: dict[tuple[str, str], Site] = {s.key: s for s in merged}
    for f in findings:
        site = keyed.get((f.path, f.function.rsplit(".", 1)[-1]))
        if site is not None:
            site.static.append(f"{f.pattern} @ {f.line}")
            hit.append(f)
        else:
            missed.append(f)
    return hit, missed


def relevant_files(built: Built) -> list[Path]:
    """The files a call of this scenario runs through: pipeline, its models and scheduler, and the hooks."""
    classes = [resolve(built.scenario.pipeline_cls)] + [type(c) for c in built.pipe.components.values()
                                                        if c is not None and type(c).__module__.startswith("diffusers")]
    modules = {c.__module__ for c in classes}
    modules |= {"diffusers.hooks.hooks", "diffusers.models.cache_utils", "diffusers.utils.torch_utils"}
    root = diffusers_root()
    return sorted({root / (name.replace(".", "/") + ".py") for name in modules if (root / (name.replace(".", "/") + ".py")).exists()})


def hunt(built: Built, trace_dir: Path, stem: str, seed: int, progress: Callable[[str], None]) -> dict:
    """Every sync site of one call (the profiler's, sync debug mode's, the scan's), the call's device work by kind,
    and the GPU-side waste one more call shows (`lab.measure.waste`)."""
    from lab.measure.waste import watch_call
    from lab.traces.work import summary, work_analysis

    progress("profiling one call with Python stacks and shapes ...")
    timed_call(built, seed=seed, marks=False)
    trace = profile_call(built, trace_dir, stem, ProfileOptions(record_shapes=True, with_stack=True), seed=seed)["trace"]
    parsed = load(trace)
    frames = Frames(parsed)
    sites, kind, steps_run = profiler_sites(parsed, built.device, frames)
    work = summary(work_analysis(parsed, frames))
    progress("one call under CUDA sync debug mode ...")
    debug, debug_note = debug_sites(built, seed)
    merged = merge(sites, debug)
    files = relevant_files(built)
    progress(f"static scan of {len(files)} files ...")
    findings = scan(files)
    hit, _ = match_static(merged, findings)
    runtime = [s for s in merged if not any(s.path.startswith(h) for h in _HARNESS)]
    missed_by_scan = [s for s in runtime if not s.static and s.path != "(no Python stack)"]
    in_loop = sum(s.phases.get("in loop", 0) for s in runtime)
    found_waste = watch_call(built, seed, progress)
    return {
        "work": work,
        "waste": found_waste,
        "what": kind,
        "debug_mode_note": debug_note,
        "trace": str(trace),
        "sites": [s.to_dict() for s in merged],
        "per_call": sum(s.profiler_count for s in runtime),
        "steps_run": steps_run,  # may be fewer than asked for: img2img/video2video start part-way
        "in_loop_per_step": in_loop / steps_run if steps_run else 0.0,
        "harness_syncs": sum(s.profiler_count for s in merged if any(s.path.startswith(h) for h in _HARNESS)),
        "static_candidates": len(findings),
        "static_hit": [dataclasses.asdict(f) for f in hit],
        "runtime_missed_by_scan": [f"{s.path} {s.function}" for s in missed_by_scan],
        "files_scanned": [p.relative_to(diffusers_root()).as_posix() for p in files],
    }


def _setting(result: HuntResult) -> str:
    layers = f", {result.layers} blocks" if result.layers else ""
    run = result.steps_run or result.steps
    steps = f"{result.steps} steps" + (f", {run} run" if run != result.steps else "")
    return f"{result.size}{layers}, {result.mode}, {steps}"


def markdown(result: HuntResult) -> str:
    env = result.environment
    lines = [f"# Sync hunt: `{result.scenario}` ({_setting(result)})"
             + (f" with {', '.join(result.fixes)}" if result.fixes else ""), "",
             f"{env.gpu}; torch {env.torch}, diffusers {env.diffusers}. Counting {result.what}.", "",
             f"**{result.per_call} per call, {result.in_loop_per_step:.2f} per denoising step inside the loop** "
             f"(not counting the lab's own {result.harness_syncs} at the call boundaries).", ""]
    if result.debug_mode_note:
        lines += [f"Note: {result.debug_mode_note}.", ""]
    lines += ["| site | function | profiler | debug mode (lines) | blocked | phase | per step | static candidates |",
              "|---|---|---|---|---|---|---|---|"]
    for s in result.sites:
        lines.append(
            f"| `{s['path']}` | `{s['function']}` | {s['profiler_count']} | {s['debug_count']}"
            f"{' (' + ', '.join(map(str, s['lines'])) + ')' if s['lines'] else ''} | {s['blocked_us'] / 1000:,.1f} ms | "
            f"{', '.join(f'{k}: {v}' for k, v in s['phases'].items())} | "
            f"{', '.join(f'{k}: {v}' for k, v in s['per_step'].items())} | {'; '.join(s['static']) or '—'} |")
    if result.work and "missing" not in result.work:
        lines += ["", "## Where the device time goes", ""] + work_table(result.work)
    lines += [""] + waste_lines(result.waste, result.compiler)
    lines += [f"Static scan: {result.static_candidates} candidates in {len(result.files_scanned)} files; "
              f"{len(result.static_hit)} in functions that synced at run time. Runtime sites the scan has no "
              f"candidate for: {', '.join(result.runtime_missed_by_scan) or 'none'}.", "",
              f"Command: `{result.command}`", ""]
    return "\n".join(lines)


def _runtime(result: HuntResult) -> dict[tuple[str, str], dict]:
    return {(s["path"], s["function"]): s for s in result.sites
            if not any(s["path"].startswith(h) for h in _HARNESS)}


def comparison(before: HuntResult, after: HuntResult, files: list[str] = ()) -> str:
    """Before/after table of two hunts of the same build, and whether the loop is free of syncs per step."""
    b, a = _runtime(before), _runtime(after)
    env = after.environment
    in_loop = {k: s["phases"].get("in loop", 0) for k, s in a.items() if s["phases"].get("in loop", 0)}
    goal = ("**met**: no sync inside the denoising loop" if not in_loop else
            f"**not met**: {sum(in_loop.values())} per call inside the loop, at "
            + ", ".join(f"`{fn}` ({n})" for (_, fn), n in sorted(in_loop.items(), key=lambda kv: -kv[1])))
    lines = [f"# Sync hunt before/after: `{after.scenario}` ({_setting(after)})", "",
             f"Fixes: {', '.join(after.fixes)}. {env.gpu}; torch {env.torch}, diffusers {env.diffusers}. "
             f"Counting {after.what}; the lab's own syncs at the call boundaries are left out.", "",
             f"- per call: **{before.per_call} -> {after.per_call}**",
             f"- per denoising step inside the loop: **{before.in_loop_per_step:.2f} -> {after.in_loop_per_step:.2f}**",
             f"- zero syncs per step inside the loop: {goal}", "",
             "| site | function | before | after | phase before | phase after | debug-mode lines after |",
             "|---|---|---|---|---|---|---|"]

    def phases(s: dict | None) -> str:
        return ", ".join(f"{k}: {v}" for k, v in s["phases"].items()) if s else "—"

    for key in sorted(b.keys() | a.keys(), key=lambda k: (-(b.get(k) or {}).get("profiler_count", 0), k)):
        sb, sa = b.get(key), a.get(key)
        lines.append(f"| `{key[0]}` | `{key[1]}` | {sb['profiler_count'] if sb else 0} | {sa['profiler_count'] if sa else 0} | "
                     f"{phases(sb)} | {phases(sa)} | {', '.join(map(str, sa['lines'])) if sa and sa['lines'] else '—'} |")
    lines += ["", "Reports: " + ", ".join(f"[{Path(f).stem}]({Path(f).with_suffix('.md').name})" for f in files), "",
              f"Command: `{after.command}`", ""]
    return "\n".join(lines)

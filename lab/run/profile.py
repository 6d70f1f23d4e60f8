"""`lab profile`: one warm-up call, one timed call (stage and per-step report), one profiled call.

Follows the upstream `examples/profiling` harness (labels, flags, `{pipeline}_{mode}` file names) and adds what
the serving stacks offer: shapes, stacks, memory, a CUDA memory snapshot, FLOPs, op tables, folded stacks, and
capturing only some denoising steps.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from lab.base import files
from lab.base.errors import UsageError
from lab.run.instrument import Instrumentation
from lab.run.runner import CompileSpec, synchronize, timed_call
from lab.run.scenario import Built


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    record_shapes: bool = True
    with_stack: bool = True
    profile_memory: bool = False
    memory_snapshot: bool = False
    with_flops: bool = False
    op_tables: tuple[str, ...] = ()  # of "summary", "shape", "stack"
    op_table_format: str = "md"  # "md" | "csv"
    folded_stacks: bool = False
    skip_steps: int = 0
    capture_steps: int | None = None  # None: every step (and the whole call)

    def validate(self, steps: int) -> None:
        if self.skip_steps < 0 or (self.capture_steps is not None and self.capture_steps < 1):
            raise UsageError("`--skip-steps` must be >= 0 and `--capture-steps` >= 1.")
        if self.skip_steps >= steps:
            raise UsageError(f"`--skip-steps {self.skip_steps}` skips every one of the {steps} steps.")
        if "shape" in self.op_tables and not self.record_shapes:
            raise UsageError("The `shape` op table needs shapes: drop `--no-record-shapes`.")
        if "stack" in self.op_tables and not self.with_stack:
            raise UsageError("The `stack` op table needs Python stacks: drop `--no-with-stack`.")


def _activities(device: str) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _op_rows(averages) -> list[dict[str, Any]]:
    rows = []
    for e in averages:
        rows.append({
            "name": e.key, "count": e.count,
            "self_cpu_us": e.self_cpu_time_total, "cpu_total_us": e.cpu_time_total,
            "self_device_us": getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)),
            "device_total_us": getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)),
            "input_shapes": str(getattr(e, "input_shapes", "") or ""),
            "stack": " <- ".join(getattr(e, "stack", []) or [])[:500],
        })
    rows.sort(key=lambda r: (-r["self_device_us"], -r["self_cpu_us"]))
    return rows


def _write_table(rows: list[dict], path: Path, fmt: str) -> None:
    from tabulate import tabulate

    if fmt == "csv":
        with files.whole(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["name"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        files.write_text(path, tabulate(rows, headers="keys", tablefmt="github", floatfmt=".1f") + "\n")


#: gzip level of the exported traces: 6 (zlib's default) compresses a tiny Wan call's 13.7 MB trace to 0.96 MB in
#: 0.19 s here, where 9 makes 0.86 MB in 0.83 s
TRACE_GZIP_LEVEL = 6


def export_trace(prof: torch.profiler.profile, path: Path) -> None:
    """`prof`'s Chrome trace, gzipped, whole or not at all (a Ctrl-C mid-export keeps the earlier trace).

    torch's own export to a `.gz` path writes the JSON into the gzip stream a line at a time at level 9, most of a
    small profiled call's cost. This exports the plain JSON beside the target and compresses it in large chunks at
    :data:`TRACE_GZIP_LEVEL`; any gzip reader reads either."""
    with files.whole(path) as tmp:
        raw = tmp.with_name(tmp.name + ".json")
        kineto = raw.with_name(raw.name + ".tmp")  # where torch's exporter writes before renaming it to `raw`
        try:
            prof.export_chrome_trace(str(raw))
            if not raw.exists():
                raise _not_exported(path, kineto)
            with open(raw, "rb") as fin, gzip.open(tmp, "wb", compresslevel=TRACE_GZIP_LEVEL) as fout:
                shutil.copyfileobj(fin, fout, 1 << 22)
        finally:
            raw.unlink(missing_ok=True)
            kineto.unlink(missing_ok=True)


def _not_exported(path: Path, kineto: Path) -> OSError:
    """Why torch's exporter left no trace: it logs a failed write and raises nothing, leaving its temporary file
    behind when the write stopped midway, which on a full file system is a full disk (ENOSPC), said as such rather
    than as the missing file that reading it would report."""
    import errno
    import os

    full = kineto.exists() and shutil.disk_usage(kineto.parent).free < (1 << 20)
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return OSError(errno.EIO, "torch's profiler could not write the trace (its log says why)", str(path))


def profile_call(built: Built, out_dir: Path, stem: str, options: ProfileOptions, seed: int = 0) -> dict[str, Path]:
    """Profile one call of an already warmed-up pipeline; returns the paths written."""
    options.validate(built.steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = built.device.startswith("cuda")
    experimental = None
    if options.folded_stacks:
        experimental = torch._C._profiler._ExperimentalConfig(verbose=True)
    prof = torch.profiler.profile(
        activities=_activities(built.device), record_shapes=options.record_shapes,
        profile_memory=options.profile_memory, with_stack=options.with_stack, with_flops=options.with_flops,
        experimental_config=experimental,
    )
    selective = options.skip_steps > 0 or options.capture_steps is not None
    last = None if options.capture_steps is None else options.skip_steps + options.capture_steps - 1
    state = {"running": False}
    paths: dict[str, Path] = {}

    def begin(i: int) -> None:
        if selective and i == options.skip_steps and not state["running"]:
            prof.start()
            state["running"] = True

    def end(i: int) -> None:
        if selective and state["running"] and last is not None and i == last:
            synchronize(built.device)
            prof.stop()
            state["running"] = False

    def hooks(inst: Instrumentation) -> None:
        inst.on_step_begin, inst.on_step_end = begin, end

    if cuda and options.memory_snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    if not selective:
        prof.start()
        state["running"] = True
    try:
        timed_call(built, seed=seed, marks=False, labels=True, extra_patch=hooks)
    finally:
        if state["running"]:
            synchronize(built.device)
            prof.stop()
        if cuda and options.memory_snapshot:
            paths["memory_snapshot"] = out_dir / f"{stem}_memory.pickle"
            with files.whole(paths["memory_snapshot"]) as tmp:
                torch.cuda.memory._dump_snapshot(str(tmp))
            torch.cuda.memory._record_memory_history(enabled=None)

    paths["trace"] = out_dir / f"{stem}.json.gz"
    export_trace(prof, paths["trace"])
    ext = "csv" if options.op_table_format == "csv" else "md"
    for table in options.op_tables:
        if table == "summary":
            averages = prof.key_averages()
        elif table == "shape":
            averages = prof.key_averages(group_by_input_shape=True)
        elif table == "stack":
            averages = prof.key_averages(group_by_stack_n=5)
        else:
            raise UsageError(f"Unknown op table `{table}`; choose from summary, shape, stack.")
        paths[f"ops_{table}"] = out_dir / f"{stem}_ops_{table}.{ext}"
        _write_table(_op_rows(averages), paths[f"ops_{table}"], options.op_table_format)
    if options.folded_stacks:
        metric = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        paths["stacks"] = out_dir / f"{stem}_stacks.txt"
        with files.whole(paths["stacks"]) as tmp:
            prof.export_stacks(str(tmp), metric)
    return paths


def timing_report(built: Built, spec: CompileSpec, seed: int = 0) -> dict[str, Any]:
    """The light report: a call with CUDA-event marks at step and stage boundaries, no profiler attached."""
    result = timed_call(built, seed=seed)
    return {
        "scenario": built.scenario.name, "size": built.size, "steps": built.steps, "mode": spec.describe(),
        "device": built.device, "gpu": torch.cuda.get_device_name() if built.device.startswith("cuda") else None,
        "wall_ms": result.wall_ms, "stages_ms": result.stages_ms, "steps_ms": result.steps_ms,
        "method": "CUDA events recorded at step and stage boundaries (no extra sync); wall time between syncs "
        "at the call boundaries" if built.device.startswith("cuda") else "host timestamps (CPU run)",
    }


def write_json(path: Path, data: dict) -> None:
    files.write_text(path, json.dumps(data, indent=2, default=str) + "\n")

"""`lab census`: one pipeline's syncs (host scalar reads on a CPU), copies and CPU gaps, profiled without fixes, with
each applicable fix alone and with all of them together, on one build.

Each arm is one warmed-up call profiled with Python stacks (`lab.run.profile`); its trace gives the sync sites with
their phase and step (`lab.measure.hunt.profiler_sites`), the host scalar reads and copies
(`lab.traces.analysis.host_reads_analysis`), the CPU gaps between transformer calls (`cpu_gap_analysis`) with the
functions that filled them (`lab.traces.gaps`), the GPU idle inside the loop (`gpu_idle_analysis`) and the device
work by kind (`lab.traces.work`). Which fix removes what is read off the arms: a site whose count falls from the arm
without fixes to the fix's own arm. One more call without fixes is watched for GPU-side waste (`lab.measure.waste`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lab.apply.fix import applied
from lab.measure.hunt import _HARNESS, profiler_sites
from lab.measure.waste import compiler_notes
from lab.results.schema import CensusArm
from lab.run.profile import ProfileOptions, profile_call
from lab.run.runner import timed_call
from lab.run.scenario import Built
from lab.traces.analysis import cpu_gap_analysis, gpu_idle_analysis, host_reads_analysis
from lab.traces.gaps import attribute, top_functions
from lab.traces.timeline import Frames
from lab.traces.trace import load
from lab.traces.work import summary, work_analysis


def measure_arm(built: Built, fixes: Sequence[Any], trace_dir: Path, stem: str, seed: int, *, compiled: bool,
                progress: Callable[[str], None], compiler: dict | None = None) -> tuple[CensusArm, str]:
    """Profile one call of `built` with `fixes` applied (after a warm-up call, two when compiled); the arm and what
    its counts are (syncs, or host scalar reads on a CPU-only run). `compiler`: where the compiler's warnings and
    graph breaks in the warm-up go (`lab.measure.waste.compiler_notes`: the first arm's warm-up compiles)."""
    with applied(fixes, built.pipe):
        with compiler_notes(compiler) if compiler is not None else contextlib.nullcontext():
            for _ in range(2 if compiled else 1):
                timed_call(built, seed=seed, marks=False)
        # shapes: the device work's FLOPs, roofline and strided inputs
        trace_path = profile_call(built, trace_dir, stem, ProfileOptions(record_shapes=True, with_stack=True),
                                  seed=seed)["trace"]
    trace = load(trace_path)
    frames = Frames(trace)
    sites, what, steps_run = profiler_sites(trace, built.device, frames)
    runtime = [s for s in sites.values() if not any(s.path.startswith(h) for h in _HARNESS)]
    phase = lambda name: sum(s.phases.get(name, 0) for s in runtime)  # noqa: E731
    reads = host_reads_analysis(trace, frames)
    gaps = cpu_gap_analysis(trace)
    cuda = built.device.startswith("cuda")
    idle = gpu_idle_analysis(trace, frames=frames) if cuda else {}
    arm = CensusArm(
        fixes=[f.name for f in fixes],
        per_call=sum(s.profiler_count for s in runtime),
        steps_run=steps_run,
        in_loop=phase("in loop"),
        first_step=sum(s.per_step.get("0", 0) for s in runtime),
        before_loop=phase("before loop"),
        after_loop=phase("after loop"),
        scalar_reads=reads["scalar_reads"] - _harness_reads(reads["scalar_read_sites"]),
        htod=reads["memcpy"].get("HtoD", {}).get("count", 0) if cuda else None,
        dtoh=reads["memcpy"].get("DtoH", {}).get("count", 0) if cuda else None,
        cpu_gaps_ms=None if "missing" in gaps else gaps["total_us"] / 1000,
        cpu_gap_max_ms=None if "missing" in gaps else gaps["max_us"] / 1000,
        gap_fillers=top_functions(attribute(trace, sources=("cpu gap",)), "cpu gap"),
        gpu_idle_loop_ms=idle["denoise"]["idle_us"] / 1000 if idle.get("denoise") else None,
        sites=sorted(({"path": s.path, "function": s.function, "count": s.profiler_count, "phases": s.phases,
                       "per_step": s.per_step} for s in runtime), key=lambda d: (-d["count"], d["path"])),
        trace=str(trace_path),
        work=summary(work_analysis(trace, frames)),
    )
    return arm, what


def _harness_reads(sites: dict[str, int]) -> int:
    """Host scalar reads at the lab's own frames (its call-boundary synchronization), left out of the counts."""
    return sum(n for site, n in sites.items() if any(site.startswith(h) for h in _HARNESS))

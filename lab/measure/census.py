"""`lab census`: one pipeline's syncs (host scalar reads on a CPU), copies and CPU gaps, profiled without fixes, with
each applicable fix alone and with all of them together, on one build.

Each arm is one warmed-up call profiled with Python stacks (`lab.run.profile`); its trace gives the sync sites with
their phase and step (`lab.measure.hunt.profiler_sites`), the host scalar reads and copies
(`lab.traces.analysis.host_reads_analysis`), the CPU gaps between transformer calls (`cpu_gap_analysis`) with the
functions that filled them (`lab.traces.gaps`), and the GPU idle inside the loop (`gpu_idle_analysis`). Which
fix removes what is read off the arms: a site whose count falls from the arm without fixes to the fix's own arm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lab.apply.fix import applied
from lab.measure.hunt import _HARNESS, profiler_sites
from lab.results.schema import CensusArm
from lab.run.profile import ProfileOptions, profile_call
from lab.run.runner import timed_call
from lab.run.scenario import Built
from lab.traces.analysis import cpu_gap_analysis, gpu_idle_analysis, host_reads_analysis
from lab.traces.gaps import attribute, top_functions
from lab.traces.timeline import Frames
from lab.traces.trace import load


def measure_arm(built: Built, fixes: Sequence[Any], trace_dir: Path, stem: str, seed: int, *, compiled: bool,
                progress: Callable[[str], None]) -> tuple[CensusArm, str]:
    """Profile one call of `built` with `fixes` applied (after a warm-up call, two when compiled); the arm and what
    its counts are (syncs, or host scalar reads on a CPU-only run)."""
    with applied(fixes, built.pipe):
        for _ in range(2 if compiled else 1):
            timed_call(built, seed=seed, marks=False)
        trace_path = profile_call(built, trace_dir, stem, ProfileOptions(record_shapes=False, with_stack=True),
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
    )
    return arm, what


def _harness_reads(sites: dict[str, int]) -> int:
    """Host scalar reads at the lab's own frames (its call-boundary synchronization), left out of the counts."""
    return sum(n for site, n in sites.items() if any(site.startswith(h) for h in _HARNESS))

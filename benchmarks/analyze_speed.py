"""Benchmark: `lab analyze` on the shared real trace as a whole process (wall time and peak RSS).

    python benchmarks/analyze_speed.py [--runs 5] [--trace PATH] [--out results/analyze_speed.json]

Targets (2-core machine): at most 3 s wall and 500 MB peak RSS, at least 5x faster than HTA's 15.5 s
(`../shared/reference/anchors.md`). A benchmark, not a test: timings on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTA_WALL_S = 15.5


def run_once(trace: str) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "analyze", trace], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"lab analyze failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "wan_base_compile.json.gz"))
    parser.add_argument("--out", default=str(ROOT / "results" / "analyze_speed.json"))
    args = parser.parse_args()
    walls, rss = [], []
    for i in range(args.runs):
        w, r = run_once(args.trace)
        walls.append(w)
        rss.append(r)
        print(f"run {i + 1}/{args.runs}: {w:.2f} s, {r:.0f} MiB", file=sys.stderr)
    result = {
        "command": f"python benchmarks/analyze_speed.py --runs {args.runs}",
        "trace": Path(args.trace).name, "runs": args.runs,
        "wall_s": walls, "peak_rss_mib": rss,
        "median_wall_s": statistics.median(walls), "median_peak_rss_mib": statistics.median(rss),
        "hta_wall_s": HTA_WALL_S, "speedup_vs_hta": HTA_WALL_S / statistics.median(walls),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "targets": {"wall_s": 3.0, "peak_rss_mib": 500, "speedup_vs_hta": 5.0},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median {result['median_wall_s']:.2f} s wall, {result['median_peak_rss_mib']:.0f} MiB peak RSS, "
          f"{result['speedup_vs_hta']:.1f}x faster than HTA's {HTA_WALL_S} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

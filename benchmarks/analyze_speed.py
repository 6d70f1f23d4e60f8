"""Benchmark: `lab analyze` on the real trace against a bare `json.load` of the same trace, both as whole processes.

    python benchmarks/analyze_speed.py [--pairs 5] [--trace PATH] [--out results/analyze_speed.json]

Pairs alternate which of the two runs first; each pair's ratio (lab analyze / json.load wall) cancels the load of
the shared machine at that moment, and the median of the ratios is the figure. Targets (2-core machine): the ratio at
or under 1.0 (every analysis in less time than Python takes to read the JSON), at least 5x faster than HTA's 15.5 s
and 677 MB (`shared/reference/anchors.md`, measured on the same kind of machine). A benchmark, not a test.
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
HTA_WALL_S = 15.5  # anchors.md: HTA 0.5.0 loading and analysing this trace on a 2-core VM
HTA_PEAK_MB = 677


BARE = "import gzip, json, sys; json.load(gzip.open(sys.argv[1]) if sys.argv[1].endswith('.gz') else open(sys.argv[1]))"


def run_once(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one whole process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--trace", default="tests/data/traces/wan_base_compile.json.gz",
                        help="relative to the repository root, or absolute")
    parser.add_argument("--out", default=str(ROOT / "results" / "analyze_speed.json"))
    args = parser.parse_args()
    trace = str(ROOT / args.trace)
    arms = {"lab_analyze": [sys.executable, "-m", "lab.cli", "analyze", trace],
            "json_load": [sys.executable, "-c", BARE, trace]}
    runs: dict[str, list[tuple[float, float]]] = {"lab_analyze": [], "json_load": []}
    ratios = []
    for i in range(args.pairs):
        order = ["lab_analyze", "json_load"] if i % 2 == 0 else ["json_load", "lab_analyze"]
        for arm in order:
            runs[arm].append(run_once(arms[arm]))
        ratio = runs["lab_analyze"][-1][0] / runs["json_load"][-1][0]
        ratios.append(ratio)
        print(f"pair {i + 1}/{args.pairs} ({order[0]} first): lab analyze {runs['lab_analyze'][-1][0]:.2f} s, "
              f"json.load {runs['json_load'][-1][0]:.2f} s, ratio {ratio:.3f}", file=sys.stderr)
    med = {arm: statistics.median(w for w, _ in r) for arm, r in runs.items()}
    rss = {arm: statistics.median(m for _, m in r) for arm, r in runs.items()}
    result = {
        "command": f"python benchmarks/analyze_speed.py --pairs {args.pairs}",
        "trace": args.trace, "pairs": args.pairs,
        "wall_s": {arm: [w for w, _ in r] for arm, r in runs.items()},
        "peak_rss_mib": {arm: [m for _, m in r] for arm, r in runs.items()},
        "ratio_per_pair": ratios, "median_ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "median_wall_s": med["lab_analyze"], "median_peak_rss_mib": rss["lab_analyze"],
        "json_load_median_wall_s": med["json_load"], "json_load_median_peak_rss_mib": rss["json_load"],
        "hta_wall_s": HTA_WALL_S, "hta_peak_rss_mb": HTA_PEAK_MB, "speedup_vs_hta": HTA_WALL_S / med["lab_analyze"],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "targets": {"median_ratio": 1.0, "speedup_vs_hta": 5.0},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"lab analyze {med['lab_analyze']:.2f} s ({rss['lab_analyze']:.0f} MiB) against json.load "
          f"{med['json_load']:.2f} s ({rss['json_load']:.0f} MiB): median ratio {result['median_ratio']:.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}] over {args.pairs} pairs; {result['speedup_vs_hta']:.1f}x faster "
          f"than HTA's {HTA_WALL_S} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

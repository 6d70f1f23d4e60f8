"""Benchmark: `lab table` on a copy of the committed results, as a whole process.

    python benchmarks/table_speed.py [--runs 3] [--out PATH]

The committed `results/` and `campaigns/` are copied to a temporary folder (`lab table` rewrites the README, pages
and plots it writes, and the committed ones stay as they are); then `lab table --results <copy>` runs `--runs` times
there. The first run is timed apart: where the plots drawn from many results have no key beside them yet (a tree
from before the keys), it draws them all, and every later run finds them current. The figure is the median wall time
of the later runs; the target, at or under 30 s on the 2-core machine. Each run's output is checked against the first
run's, byte for byte: the same results write the same files. The load of the machine (the 1-minute load average
before and after each run) goes with each time, since the machine is shared. It prints the record and writes it to
`--out` when given. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(results: Path) -> dict:
    """One `lab table` on `results`: its wall seconds and the load average around it."""
    before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lab.cli", "table", "--results", str(results)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"lab table failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return {"wall_s": round(wall, 2), "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)}


def differing(a: Path, b: Path) -> list[str]:
    """The files that differ between two folders, or that one has and the other has not."""
    out = []
    compared = filecmp.dircmp(a, b)
    out += [str(Path(a, n)) for n in compared.left_only + compared.right_only + compared.diff_files]
    out += [str(Path(a, n)) for n in compared.common_files
            if not filecmp.cmp(Path(a, n), Path(b, n), shallow=False) and str(Path(a, n)) not in out]
    for sub in compared.common_dirs:
        out += differing(a / sub, b / sub)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of lab table, the first counted apart (at least 2)")
    parser.add_argument("--out", help="also write the record here (JSON)")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2: the first run is counted apart")
    with tempfile.TemporaryDirectory(prefix="table_speed_") as tmp:
        work = Path(tmp) / "tree"
        for folder in ("results", "campaigns"):
            shutil.copytree(ROOT / folder, work / folder)
        first = timed(work / "results")
        print(f"run 1 (first): {first['wall_s']:.1f} s (load {first['load_before']} -> {first['load_after']})")
        shutil.copytree(work / "results", Path(tmp) / "after_first")
        later = []
        for i in range(2, args.runs + 1):
            later.append(timed(work / "results"))
            print(f"run {i}: {later[-1]['wall_s']:.1f} s (load {later[-1]['load_before']} -> {later[-1]['load_after']})")
        changed = differing(Path(tmp) / "after_first", work / "results")
    record = {
        "command": "lab table --results <a copy of results/>",
        "runs": args.runs,
        "first_run": first,
        "later_runs": later,
        "median_wall_s": statistics.median(r["wall_s"] for r in later),
        "target_s": 30.0,
        "output_changed_after_the_first_run": changed,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())

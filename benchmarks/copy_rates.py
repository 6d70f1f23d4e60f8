"""Benchmark: the host's five copy rates to and from its GPU, as every result now records them.

    python benchmarks/copy_rates.py [--out results/copy_rates/h200.json]

Runs `lab.run.copy_rates.measure` (1 GiB per copy, the median of three after a warm-up) and records the rates with the
GPU, the host's CPUs and how long the measurement took, which every process that records a result pays once per host
and boot. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from lab.run.copy_rates import measure

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("copy_rates.py: needs CUDA")
        return 2
    started = time.perf_counter()
    rates = measure(torch.device("cuda"))
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cpus": os.cpu_count(),
              "python": platform.python_version(), "rates_gb_s": rates,
              "seconds": round(time.perf_counter() - started, 2), "command": "python benchmarks/copy_rates.py"}
    print(json.dumps(record, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

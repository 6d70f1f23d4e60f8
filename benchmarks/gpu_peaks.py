"""Benchmark: the two ceilings of the GPU it runs on, measured, beside the datasheet's (`lab/traces/peaks.py`).

    python benchmarks/gpu_peaks.py [--out results/peaks]

A large bf16 matmul (the rate the roofline's FLOPs are held against) and a large device-to-device copy (bytes read
plus bytes written, the bandwidth the memory-bound classes are held against), each timed with CUDA events over
repeated runs after a warm-up, on random data (zeros run faster). The median of the repeats is the figure; the result
names the GPU and sits beside the datasheet's peak, so that a page can say how far below the datasheet the host's own
ceiling is. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn, repeats: int) -> list[float]:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def main() -> int:
    import torch

    from lab.base import files
    from lab.base.naming import device_tag_of
    from lab.traces.peaks import peak_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "peaks"))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_peaks: needs a CUDA device", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    matmul_s = timed(lambda: a @ b, args.repeats)
    size = 2 << 30  # 2 GiB each way
    src = torch.randn(size // 4, device="cuda")
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), args.repeats)
    tflops = [2 * n**3 / s / 1e12 for s in matmul_s]
    tbs = [2 * size / s / 1e12 for s in copy_s]
    peak = peak_for(name)
    result = {
        "command": "python benchmarks/gpu_peaks.py", "gpu": name, "torch": torch.__version__,
        "cuda": torch.version.cuda, "repeats": args.repeats,
        "bf16_matmul_tflops": {"median": statistics.median(tflops), "min": min(tflops), "max": max(tflops),
                               "shape": [n, n, n]},
        "device_copy_tbs": {"median": statistics.median(tbs), "min": min(tbs), "max": max(tbs),
                            "bytes_each_way": size},
        "datasheet": None if peak is None else {"model": peak.model, "bf16_tflops": peak.bf16_tflops,
                                                "bandwidth_tbs": peak.bandwidth_tbs, "source": peak.source},
    }
    out = Path(args.out) / f"{device_tag_of(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(out, json.dumps(result, indent=1) + "\n")
    ratio = "" if peak is None else (f" ({statistics.median(tflops) / peak.bf16_tflops:.0%} and "
                                     f"{statistics.median(tbs) / peak.bandwidth_tbs:.0%} of the datasheet's)")
    print(f"{name}: bf16 matmul {statistics.median(tflops):,.0f} TFLOP/s, device copy "
          f"{statistics.median(tbs):.2f} TB/s{ratio}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

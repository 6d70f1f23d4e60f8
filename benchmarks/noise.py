"""Where the spread of the per-block ratio comes from, and which block layout removes most of it, per second of GPU.

One build of one case (default: `qwen_modulate_index` on Qwen-Image `zero_cond`, the case whose H100 run the
sequential rule was made for), then rounds in which every layout runs the same number of blocks in turn, so that a
slow spell of the machine falls on all of them. Layouts:

- `old`: the former default, a warm-up call before every timed call, 3 timed calls per arm (C T T C C T);
- `campaign`: what most committed GPU results used, no warm-up, 2 timed calls per arm (C T T C);
- `lead-in`: the new default, one untimed call at the start of the block, then C T T C;
- `lead-in, pinned`: the same with the process pinned to a few CPU cores (`os.sched_setaffinity`, every thread).

For each: the robust spread of the per-block log ratio (1.4826 MAD, in %), the seconds per block, and the blocks
and seconds that an interval of ±0.5 % would need (n ~ (2.6 sd / 0.5 %)^2 at the sequential per-look level),
the figure of merit: it combines spread and cost. Writes `results/noise/<case>__<device>.{json,md}`.

    python benchmarks/noise.py --pipeline qwenimage_zero_cond --fix qwen_modulate_index --layers 8 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import results  # noqa: E402
from lab.apply.fix import get_fix  # noqa: E402
from lab.base import console  # noqa: E402
from lab.commands._shared import device_tag  # noqa: E402
from lab.measure import ab, blocks  # noqa: E402
from lab.run.scenario import build, get_scenario  # noqa: E402
from lab.verdicts import stats  # noqa: E402

LAYOUTS = {
    "old": dict(lead_in=0, warmup=1, repeat=3),
    "campaign": dict(lead_in=0, warmup=0, repeat=2),
    "lead-in": dict(lead_in=1, warmup=0, repeat=2),
    "lead-in, pinned": dict(lead_in=1, warmup=0, repeat=2),
}


def pin(cores: set[int] | None) -> None:
    """Pin every thread of this process to `cores` (None: all cores)."""
    cores = cores or set(range(os.cpu_count() or 1))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", default="qwenimage_zero_cond")
    p.add_argument("--fix", default="qwen_modulate_index")
    p.add_argument("--size", default=None)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=8, help="blocks per layout per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cores", default="0-3", help="the cores of the pinned layout")
    p.add_argument("--out", default="results/noise")
    args = p.parse_args()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = args.size or ("full" if device == "cuda" else "tiny")
    layers = args.layers if size == "full" else None
    lo, _, hi = args.cores.partition("-")
    cores = set(range(int(lo), int(hi or lo) + 1))
    built = build(get_scenario(args.pipeline), size=size, device=device, layers=layers)
    arms = [ab.Arm("control", []), ab.Arm("test", [get_fix(args.fix)])]
    for arm in arms:
        arm.call(built, 1, 0, marks=False)
    data = {name: {"log_ratios": [], "block_s": [], "calls": {"control": [], "test": []}} for name in LAYOUTS}
    log = Path("traces") / f"noise_{args.pipeline}.log"
    with console.captured(log):
        measure(built, arms, data, args, cores)
    pin(None)
    design = stats.sequential_design(6, 40)
    z = -_norm_ppf(design.alpha_look / 2)
    rows = []
    for name, d in data.items():
        sd = 1.4826 * stats.mad(d["log_ratios"]) * 100
        block_s = stats.median(d["block_s"])
        need = (z * sd / 0.5) ** 2
        modes = {arm: stats.bimodal(v) for arm, v in d["calls"].items()}
        rows.append({"layout": name, **LAYOUTS[name], "pinned": "pinned" in name, "blocks": len(d["log_ratios"]),
                     "estimate": math.exp(stats.hodges_lehmann(d["log_ratios"], 0.05).estimate),
                     "spread_pct": sd, "sd_pct": float(_sd(d["log_ratios"]) * 100), "block_s": block_s,
                     "blocks_for_half_pct": need, "seconds_for_half_pct": need * block_s,
                     "bimodal": {arm: dataclasses.asdict(m) for arm, m in modes.items() if m}, "raw": d})
    env = results.environment(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.pipeline}__{args.fix}__{size}{f'-{layers}l' if layers else ''}__{device_tag(device)}"
    report = {"format": results.FORMAT_VERSION, "kind": "noise", "case": {"pipeline": args.pipeline, "fix": args.fix,
              "size": size, "layers": layers}, "rounds": args.rounds, "blocks_per_round": args.blocks,
              "cores": sorted(cores), "environment": env, "command": "python " + " ".join(sys.argv), "layouts": rows}
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def measure(built, arms, data: dict, args, cores: set[int]) -> None:
    """Rounds in which every layout runs `args.blocks` blocks in turn."""
    for r in range(args.rounds):
        for name, layout in LAYOUTS.items():
            pin(cores if "pinned" in name else None)
            config = ab.ABConfig(blocks=args.blocks, seed=1000 * r + len(data[name]["block_s"]), profile=False, **layout)
            t0 = time.perf_counter()
            bench = blocks.benchmark(built, arms, config, lambda _: None)
            s = bench["samples"]
            data[name]["log_ratios"] += stats.log_ratios(s["control"]["wall_ms"], s["test"]["wall_ms"])
            data[name]["block_s"] += bench["block_s"]
            for arm in ("control", "test"):
                data[name]["calls"][arm] += [x for b in s[arm]["raw_wall_ms"] for x in b]
            console.progress(f"round {r + 1}/{args.rounds} {name}: {time.perf_counter() - t0:.1f} s")


def _sd(v):
    import numpy as np

    return np.std(np.asarray(v), ddof=1)


def _norm_ppf(q: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(q))


def markdown(report: dict) -> str:
    c, env = report["case"], report["environment"]
    depth = f", {c['layers']} transformer blocks" if c["layers"] else ""
    lines = [f"# Block layouts: spread of the per-block ratio, `{c['fix']}` on `{c['pipeline']}`", "",
             f"{c['size']}{depth} · "
             f"eager · {env.get('gpu')} · {report['rounds']} rounds x {report['blocks_per_round']} blocks per layout, "
             "layouts taking turns", "",
             "| layout | lead-in | warm-up per switch | timed calls per arm | blocks | estimate | spread of log ratio "
             "(1.4826 MAD) | sd | s per block | blocks for ±0.5 % | GPU-s for ±0.5 % | bimodal arms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["layouts"]:
        modes = "; ".join(f"{arm}: {m['n_low']} near {m['low']:.0f} ms, {m['n_high']} near {m['high']:.0f} ms"
                          for arm, m in r["bimodal"].items()) or "none"
        lines.append(f"| {r['layout']} | {r['lead_in']} | {r['warmup']} | {r['repeat']} | {r['blocks']} | "
                     f"{r['estimate']:.4f} | {r['spread_pct']:.2f} % | {r['sd_pct']:.2f} % | {r['block_s']:.2f} | "
                     f"{r['blocks_for_half_pct']:.0f} | {r['seconds_for_half_pct']:.0f} | {modes} |")
    lines += ["", "Blocks for ±0.5 %: about (z sd / 0.5 %)^2 with z at the sequential per-look level of 6 to 40 blocks; "
              "the GPU-seconds multiply by the seconds per block, so a layout that costs more per block must cut the "
              "spread by more than the square root of its cost to pay off.", "",
              f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

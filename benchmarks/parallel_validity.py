"""Do measurements stay valid when cells share a host? The same measurements on GPU 0, first alone (GPU 1 idle),
then beside a running campaign cell on GPU 1, each side pinned to its own half of the cores:

- an A/A calibration with a positive control (`lab calibrate`, the sequential rule as `lab ab` uses it) on the tiny
  Wan scenario on the GPU: host-bound calls of a few milliseconds, the most sensitive to a busy neighbour;
- a known effect: `qwen_modulate_index` on Qwen-Image `zero_cond` at true size (8 blocks), without profiles.

Writes `results/parallel/validity__<gpu>.{json,md}` with both sides: false positives, power, the effect with its
interval and blocks, and the spread of the per-block ratios.

    python benchmarks/parallel_validity.py --neighbour "lab campaign run campaigns/coverage.toml --redo-undecided --only ltx2"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import results  # noqa: E402
from lab.campaigns.cluster import worker_cores  # noqa: E402
from lab.measure.calibrate import wilson  # noqa: E402
import msgspec  # noqa: E402

from lab.verdicts import stats  # noqa: E402

OUT = Path("results/parallel")


def lab(argv: list[str], gpu: str, cores: set[int], log: Path, wait: bool = True):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "a")
    out.write(f"$ CUDA_VISIBLE_DEVICES={gpu} (cores {min(cores)}-{max(cores)}) {' '.join(argv)}\n")
    out.flush()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if wait:
        proc.wait()
        out.close()
    return proc


def measure(side: str, cores: set[int], args) -> dict:
    py = [sys.executable, "-m", "lab.cli"]
    log = OUT / f"{side}.log"
    t0 = time.time()
    lab(py + ["calibrate", "--pipeline", "wan", "--size", "tiny", "--device", "cuda", "--trials", str(args.trials),
              "--max-blocks", "20", "--stall-ms", str(args.stall_ms), "--out", str(OUT), "--name", f"calibration-{side}",
              "--replace"], "0", cores, log)
    t1 = time.time()
    lab(py + ["ab", "--fix", "qwen_modulate_index", "--pipeline", "qwenimage_zero_cond", "--size", "full", "--layers", "8",
              "--no-profile", "--out", str(OUT), "--name", f"effect-{side}", "--replace"], "0", cores, log)
    t2 = time.time()
    return {"calibration": msgspec.to_builtins(results.read(OUT / f"calibration-{side}.json")),
            "effect": msgspec.to_builtins(results.read(OUT / "qwenimage_zero_cond" / f"effect-{side}.json")),
            "seconds": {"calibration": t1 - t0, "effect": t2 - t1}}


def summary(m: dict) -> dict:
    c, e = m["calibration"], m["effect"]
    s = e["stats"]
    d = stats.log_ratios(e["samples"]["control"]["wall_ms"], e["samples"]["test"]["wall_ms"])
    aa_d = [x for t in c["trials"]["aa"] for x in stats.log_ratios(t["control_ms"], t["test_ms"])]
    return {"aa_trials": c["aa"]["trials"], "false_positives": c["aa"]["false_positives"],
            "false_positive_ci95": wilson(c["aa"]["false_positives"], c["aa"]["trials"]),
            "aa_blocks_median": c["aa"]["blocks_median"], "aa_spread_pct": 1.4826 * stats.mad(aa_d) * 100,
            "power": c["positive"]["power"], "positive_blocks_median": c["positive"]["blocks_median"],
            "tiny_call_ms": c["call_ms_median"],
            "effect_verdict": e["verdict"], "effect_ratio": s["ratio"], "effect_ci": s["ci"], "effect_blocks": s["n"],
            "effect_spread_pct": 1.4826 * stats.mad(d) * 100, "effect_call_ms": s["control_median"]}


def markdown(report: dict) -> str:
    a, b = report["alone"]["summary"], report["beside"]["summary"]
    rows = [("A/A false positives (tiny Wan, sequential rule)", f"{a['false_positives']} / {a['aa_trials']}",
             f"{b['false_positives']} / {b['aa_trials']}"),
            ("  95% CI (Wilson)", "{:.3f}–{:.3f}".format(*a["false_positive_ci95"]),
             "{:.3f}–{:.3f}".format(*b["false_positive_ci95"])),
            ("A/A spread of block log ratios (1.4826 MAD)", f"{a['aa_spread_pct']:.2f} %", f"{b['aa_spread_pct']:.2f} %"),
            ("A/A blocks to a verdict (median)", f"{a['aa_blocks_median']:g}", f"{b['aa_blocks_median']:g}"),
            ("tiny call (median)", f"{a['tiny_call_ms']:.1f} ms", f"{b['tiny_call_ms']:.1f} ms"),
            (f"power: {report['stall_ms']} ms stall per step", f"{a['power']:.2f}", f"{b['power']:.2f}"),
            ("known effect: verdict", a["effect_verdict"], b["effect_verdict"]),
            ("  test/control [95% sequential CI]", "{:.4f} [{:.4f}, {:.4f}]".format(a["effect_ratio"], *a["effect_ci"]),
             "{:.4f} [{:.4f}, {:.4f}]".format(b["effect_ratio"], *b["effect_ci"])),
            ("  blocks", f"{a['effect_blocks']}", f"{b['effect_blocks']}"),
            ("  spread of block log ratios", f"{a['effect_spread_pct']:.2f} %", f"{b['effect_spread_pct']:.2f} %"),
            ("  control call (median)", f"{a['effect_call_ms']:.1f} ms", f"{b['effect_call_ms']:.1f} ms")]
    env = report["environment"]
    return "\n".join([
        f"# Measuring beside another cell: {env.get('gpu')} x {report['gpus']}", "",
        f"GPU 0 on cores {report['cores'][0]}, alone and then beside `{report['neighbour']}` on GPU 1 (cores "
        f"{report['cores'][1]}). torch {env['torch']}, diffusers {env['diffusers']}, lab {env['lab_commit']}.", "",
        "| measure | alone | beside a running cell |", "|---|---|---|",
        *[f"| {a_} | {b_} | {c_} |" for a_, b_, c_ in rows], "",
        f"Command: `{report['command']}`", ""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--neighbour", required=True, help="the command that keeps GPU 1 busy during the second side")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--stall-ms", type=float, default=0.1)
    args = p.parse_args()
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        print("needs two GPUs", file=sys.stderr)
        return 2
    halves = [worker_cores(0, 2), worker_cores(1, 2)]
    report = {"format": results.FORMAT_VERSION, "kind": "parallel_validity", "gpus": n, "neighbour": args.neighbour,
              "stall_ms": args.stall_ms, "cores": [f"{min(c)}-{max(c)}" for c in halves],
              "environment": results.environment("cuda"), "command": "python " + " ".join(shlex.quote(a) for a in sys.argv)}
    report["alone"] = measure("alone", halves[0], args)
    words = shlex.split(args.neighbour)
    argv = [sys.executable, "-m", "lab.cli", *words[1:]] if words[0] == "lab" else words
    neighbour = lab(argv, "1", halves[1], OUT / "neighbour.log", wait=False)
    time.sleep(20)  # let it get past its start
    report["beside"] = measure("beside", halves[0], args)
    report["neighbour_still_running"] = neighbour.poll() is None
    os.killpg(neighbour.pid, signal.SIGTERM)
    neighbour.wait()
    for side in ("alone", "beside"):
        report[side]["summary"] = summary(report[side])
    stem = f"validity__{report['environment'].get('gpu', 'gpu').split()[-1].lower()}"
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (OUT / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

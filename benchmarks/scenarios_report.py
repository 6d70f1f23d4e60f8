"""Build every scenario at `full` size, run one 4-step eager call each, and write results/scenarios.md.

    python benchmarks/scenarios_report.py [--scenarios flux,wan] [--layers N] [--out results/scenarios.md]

Each scenario runs in its own `lab run` process (so GPU memory is freed between them) with one warm-up call
first; the table gives the GPU, parameter count, peak GPU memory of the timed call, seconds per call and the
exact command. A scenario that fails (e.g. does not fit) is reported as such, with its error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from lab.run.scenario import catalog

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="all")
    parser.add_argument("--size", default="full")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "results" / "scenarios.md"))
    args = parser.parse_args()
    names = list(catalog()) if args.scenarios == "all" else args.scenarios.split(",")
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "run.json"
            cmd = ["lab", "run", "--pipeline", name, "--size", args.size, "--steps", str(args.steps), "--warmup", "1",
                   "--json", str(report)] + (["--layers", str(args.layers)] if args.layers else [])
            print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, "-m", "lab.cli", *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
            sys.stderr.write(proc.stderr[-2000:])
            if proc.returncode == 0 and report.exists():
                r = json.loads(report.read_text())
                rows.append((name, r, " ".join(cmd[:-2] if "--json" in cmd else cmd), None))
            else:
                error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                rows.append((name, None, " ".join(cmd), error))
    lines = ["# Scenarios at full size", "",
             "One 4-step eager call per scenario after one warm-up call, random weights from the true configs, "
             "prompt embeddings of the true shapes, `output_type=\"latent\"`. Produced by "
             f"`python benchmarks/scenarios_report.py{' --layers ' + str(args.layers) if args.layers else ''}`.", "",
             "| scenario | GPU | parameters | peak GPU memory (timed call) | seconds per call | output | finite | command |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r, cmd, error in rows:
        if r is None:
            lines.append(f"| {name} | | | | failed: {error} | | | `{cmd}` |")
            continue
        peak = f"{r['peak_gpu_bytes'] / 2**30:.1f} GiB" if r.get("peak_gpu_bytes") else "n/a"
        lines.append(f"| {name} | {r.get('gpu') or r['device']} | {r['params'] / 1e9:.2f} B | {peak} | "
                     f"{r['wall_ms'] / 1e3:.2f} | {tuple(r['output_shape'])} | {'yes' if r['finite'] else 'NO'} | `{cmd}` |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

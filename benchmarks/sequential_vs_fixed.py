"""Blocks and GPU-seconds to a decision: the sequential rule against a fixed design of 8 blocks, on the same runs.

Each case is one sequential `lab ab` run (its result JSON keeps every block). The fixed design's verdict is read
off the first 8 of those blocks with the fixed-design rule (one look at 95 % / 90 %), and its cost is 8 times the
run's median seconds per block; the sequential rule's cost is the blocks it ran until it decided (or stopped). So
both designs are judged on the same measurements, and the comparison is about the rule, not about the machine.

    python benchmarks/sequential_vs_fixed.py --run            # runs the three cases below with `lab ab`, then reports
    python benchmarks/sequential_vs_fixed.py RESULT.json ...  # reports on sequential results that exist

Writes `results/sequential_vs_fixed.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import results  # noqa: E402
from lab.verdicts import stats  # noqa: E402
from lab.verdicts.verdict import Verdict  # noqa: E402

#: a clear effect, a small one, and (probably) none: each a cell of the GPU coverage table
CASES = (
    "lab ab --fix qwen_modulate_index --pipeline qwenimage_zero_cond --size full --layers 8 --replace",
    "lab ab --fix all --pipeline ltx2 --size full --layers 8 --replace",
    "lab ab --fix no_progress_bar --pipeline ltx2 --size full --layers 8 --replace",
)
FIXED = 8


def _decided(side: dict) -> bool:
    """Whether one rule decided (rows written before `decided` was kept say it in words only)."""
    return side["decided"] if "decided" in side else Verdict.from_text(side["verdict"]).decided


def compare(path: Path) -> dict:
    r = results.read(path)
    c, t = r.samples.control.wall_ms, r.samples.test.wall_ms
    block_s = stats.median(r.block_s)
    seq = r.stats
    out = {"result": path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path),
           "scenario": r.scenario, "fixes": r.fixes, "mode": r.mode, "gpu": r.environment.gpu,
           "block_s": block_s,
           "sequential": {"verdict": r.verdict_text, "decided": r.verdict.decided, "blocks": seq.n,
                          "seconds": sum(r.block_s), "ratio": seq.ratio, "ci": list(seq.ci), "stopped": r.stopped}}
    if len(c) >= FIXED:
        fixed = stats.compare(c[:FIXED], t[:FIXED], design=stats.fixed_design(FIXED), margin=seq.margin)
        out["fixed"] = {"verdict": fixed.verdict, "decided": fixed.outcome.decided, "blocks": FIXED,
                        "seconds": FIXED * block_s, "ratio": fixed.ratio, "ci": list(fixed.ci)}
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["# Sequential rule against a fixed design of 8 blocks", "",
             "Same runs, two rules: the fixed design reads its verdict off the first 8 blocks; the sequential rule "
             "stops when its interval decides (or at its limit). GPU-seconds count the timing blocks only.", "",
             "| case | GPU | fixed 8 blocks: verdict | GPU-s | sequential: verdict | blocks | GPU-s | stopped |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, s = r.get("fixed"), r["sequential"]
        fixed = f"{f['verdict']} ({f['ratio']:.4f})" if f else "n/a"
        lines.append(f"| `{' + '.join(r['fixes'])}` on `{r['scenario']}` ({r['mode'].split(' ')[0]}) | {r['gpu']} | "
                     f"{fixed} | {f['seconds']:.0f} | {s['verdict']} ({s['ratio']:.4f}) | {s['blocks']} | "
                     f"{s['seconds']:.0f} | {s['stopped']} |")
    decided = [r for r in rows if r.get("fixed") and _decided(r["fixed"])]
    lines += ["", f"Decided by the fixed design: {len(decided)} of {len(rows)}; by the sequential rule: "
              f"{sum(_decided(r['sequential']) for r in rows)} of {len(rows)}. Where both decided, "
              f"GPU-seconds fixed {sum(r['fixed']['seconds'] for r in decided):.0f} vs sequential "
              f"{sum(r['sequential']['seconds'] for r in decided):.0f}.", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="*", type=Path, help="sequential `lab ab` result JSONs")
    p.add_argument("--run", action="store_true", help="run the cases first")
    p.add_argument("--cases", help="which cases to run, by number (0,1,2; default all)")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args()
    paths = list(args.results)
    if args.run:
        chosen = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
        for command in chosen:
            print(f"$ {command}", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, "-m", "lab.cli", *shlex.split(command)[1:]], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                print(f"failed ({proc.returncode}): {command}", file=sys.stderr)
                continue
            written = [line.split("wrote ", 1)[1].split(",")[0] for line in proc.stdout.splitlines()
                       if line.startswith("wrote ")]
            paths += [ROOT / w for w in written]
    known = args.out / "sequential_vs_fixed.json"
    if not paths and known.exists():  # report again on the cases a previous run measured
        paths = [ROOT / c["result"] for c in json.loads(known.read_text())["cases"]]
    elif known.exists():  # add to the cases measured before (one GPU call may not hold all three)
        before = [ROOT / c["result"] for c in json.loads(known.read_text())["cases"]]
        paths = [p for p in before if p not in paths and p.exists()] + paths
    rows = [compare(p) for p in paths]
    report = {"format": results.FORMAT_VERSION, "kind": "sequential_vs_fixed", "fixed_blocks": FIXED, "cases": rows,
              "command": "python benchmarks/sequential_vs_fixed.py " + " ".join(sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sequential_vs_fixed.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "sequential_vs_fixed.md").write_text(markdown(rows) + f"\nCommand: `{report['command']}`\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

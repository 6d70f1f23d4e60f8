"""Benchmark: how well one arm's call-to-call spread inside its blocks predicts the spread of the per-block log ratio,
on every committed GPU A/B result that did not find a change (equivalent or undecided), 7 blocks or more.

    python benchmarks/call_spread.py [--results results] [--out results/noise/call-spread.md]

`lab campaign plan` reads a setting's call spread off the control arms measured there (`stats.call_spread`) and
says about how many blocks a cell whose fix changes nothing would need to be found within the margin
(`stats.blocks_to_find_equivalent`), before that cell has run. This is the check of the step that count rests on: a
block of `repeat` calls per arm should have a log ratio spreading about call_spread * sqrt(2 / repeat). The page gives,
per result, the measured spread (1.4826 MAD of the block log ratios), the spread implied by its control arm's calls,
their ratio, and the quantiles of that ratio. A benchmark, not a test: it reads the results, it times nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.verdicts import stats  # noqa: E402


def rows(results: Path) -> list[dict]:
    out = []
    for path in sorted((results / "ab").glob("*/*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        samples = r.get("samples") or {}
        control = (samples.get("control") or {}).get("raw_wall_ms")
        test = (samples.get("test") or {}).get("raw_wall_ms")
        if r.get("verdict") not in ("equivalent", "undecided") or not control or not test or len(control) < 7:
            continue
        if path.stem.endswith("__cpu") or not isinstance(r.get("design"), dict):  # the GPU's sequential A/Bs
            continue
        repeat = len(control[0])
        if repeat < 2 or any(len(b) != repeat for b in control + test):
            continue
        spread = stats.call_spread(control)
        if spread is None or spread[0] == 0:
            continue
        d = stats.log_ratios([stats.median(b) for b in control], [stats.median(b) for b in test])
        measured = 1.4826 * stats.mad(d)
        implied = spread[0] * math.sqrt(2 / repeat)
        design = stats.Design.from_dict(r["design"])
        predicted = stats.blocks_to_find_equivalent(spread[0], repeat, r["config"]["margin"], design)
        out.append({"result": str(path.relative_to(results)), "blocks": len(control), "verdict": r["verdict"],
                    "call_s": stats.median([x for b in control for x in b]) / 1e3, "measured": measured,
                    "implied": implied, "ratio": measured / implied, "predicted": predicted,
                    "most": design.max_blocks, "sequential": design.kind == "sequential"})
    return out


def page(found: list[dict]) -> str:
    ratios = sorted(x["ratio"] for x in found)

    def q(p: float) -> float:
        return ratios[min(len(ratios) - 1, int(p * len(ratios)))]

    within2 = sum(0.5 <= x <= 2 for x in ratios)
    # the plan's claim, checked where it can be: a result that ran its sequential design to the end or decided
    seq = [x for x in found if x["sequential"] and (x["verdict"] == "equivalent" or x["blocks"] >= x["most"])]
    past = [x for x in seq if x["predicted"] > x["most"]]
    within = [x for x in seq if x["predicted"] <= x["most"]]
    past_undecided = sum(x["verdict"] == "undecided" for x in past)
    within_equivalent = sum(x["verdict"] == "equivalent" for x in within)
    lines = ["# Call spread against block spread", "",
             f"`python benchmarks/call_spread.py`: {len(found)} committed GPU A/B results that found no change "
             "(equivalent or undecided), 7 blocks or more. *measured*: 1.4826 MAD of their per-block log ratios; "
             "*implied*: their control arm's call-to-call spread inside its blocks (`stats.call_spread`) times "
             "sqrt(2 / repeat), what `lab campaign plan` assumes of a cell not yet run.", "",
             f"measured / implied: median {q(0.5):.2f}, quartiles {q(0.25):.2f} and {q(0.75):.2f}, 10th and 90th "
             f"percentiles {q(0.1):.2f} and {q(0.9):.2f}; within a factor of 2 in {within2} of {len(ratios)}. A "
             "block count goes as the square of the spread: read the plan's count as a rough guide.", "",
             f"The plan's count (`stats.blocks_to_find_equivalent`, from the control arm's calls) against what the "
             f"sequential design did, in the {len(seq)} results that decided or ran to its most blocks: of the "
             f"{len(past)} it puts past their design's most, {past_undecided} ended undecided there; of the "
             f"{len(within)} it puts within, {within_equivalent} were found equivalent (the others' fixes may not "
             "be of no effect).", "",
             "| result | blocks | verdict | control call | measured | implied | ratio | plan's count |",
             "|---|---|---|---|---|---|---|---|"]
    for x in found:
        lines.append(f"| {x['result']} | {x['blocks']} | {x['verdict']} | {x['call_s']:.1f} s | "
                     f"{x['measured'] * 100:.2f} % | {x['implied'] * 100:.2f} % | {x['ratio']:.2f} | "
                     f"{x['predicted']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "noise" / "call-spread.md")
    args = parser.parse_args()
    found = rows(args.results)
    if not found:
        print(f"no A/B result in {args.results / 'ab'} has the raw calls this needs", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page(found))
    print(f"wrote {args.out} ({len(found)} results)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

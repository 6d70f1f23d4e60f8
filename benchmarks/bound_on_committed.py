"""The naive bound against every committed GPU verdict: is "a fix cannot save more than the GPU idle it removes" true?

    python benchmarks/bound_on_committed.py [--out results/bound/committed]

The committed A/Bs store each arm's profiled GPU idle (its median and range over the profiled calls) but not the GPU's
busy time per stream that `lab.verdicts.bound` reads, so the bound the lab now uses cannot be read off them. What can
be read is the naive rule: the wall-clock gain is at most the GPU idle the fix removes, `|idle_control - idle_test|`
at the far ends of the two ranges, over the control's call. This script holds that rule against every decided
measured change (faster or slower), and lists each verdict it contradicts, with whether the fix changed the GPU's own
work (kernels or copies, counted in the profiled pair), which the rule assumes it does not. Writes `<out>.json` and
`<out>.md`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: copies per step, and the share of kernel launches, by which the arms may differ and still count as the same GPU work
SAME_COPIES = 2
SAME_LAUNCHES = 0.05


def naive(r) -> dict | None:
    """The naive rule's bound of one result, or None where its profiles hold no GPU idle."""
    metrics = (r.profile or {}).get("metrics") or {}
    idle = metrics.get("gpu_idle_us") or {}
    if idle.get("control") is None or idle.get("test") is None or not r.stats:
        return None
    c = idle.get("control_range") or [idle["control"]] * 2
    t = idle.get("test_range") or [idle["test"]] * 2
    wall_us = r.stats.control_median * 1000
    launches = metrics.get("launches") or {}
    copies = sum(abs((metrics.get(k) or {}).get("delta") or 0) for k in ("memcpy_HtoD", "memcpy_DtoH"))
    share = (abs(launches["delta"]) / launches["control"] if launches.get("control") and launches.get("delta")
             is not None else None)
    # the same GPU work within the tolerance: copies between host and device as they were, up to the handful a host
    # read of a scalar makes per step, and kernel launches within 5 %: the kernels a removed sync took with it (a
    # comparison, a copy of one value) are a few microseconds each
    work = ([f"{copies} copies"] if copies > SAME_COPIES * max(1, r.steps) else []) + (
        [f"{share:.1%} of the launches"] if share is not None and share > SAME_LAUNCHES else [])
    lo, hi = r.stats.ci
    near = min(abs(math.log(lo)), abs(math.log(hi))) if (hi < 1 or lo > 1) else 0.0
    return {"bound": max(abs(c[1] - t[0]), abs(t[1] - c[0])) / wall_us,
            "median_bound": abs(idle["control"] - idle["test"]) / wall_us, "gain": abs(math.log(r.stats.ratio)),
            "near_end": near, "gpu_work_changed": work}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bound" / "committed")
    args = parser.parse_args()

    from lab import results

    rows = []
    for path, r in results.all_results(ROOT / "results" / "ab"):
        if not results.on_gpu(r) or not r.verdict.changed_speed:
            continue
        found = naive(r)
        if found is None:
            continue
        rows.append({"result": str(path.relative_to(ROOT / "results")), "verdict": r.verdict.value,
                     "ratio": r.stats.ratio, "ci": list(r.stats.ci), "gpu": r.environment.gpu, **found,
                     "contradicted": found["bound"] < found["near_end"]})
    bad = [x for x in rows if x["contradicted"]]
    same_work = [x for x in bad if not x["gpu_work_changed"]]
    report = {"command": "python benchmarks/bound_on_committed.py " + " ".join(sys.argv[1:]), "checked": len(rows),
              "contradicted": len(bad), "contradicted_same_gpu_work": len(same_work), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["# The naive bound against the committed verdicts", "",
             f"Command: `{report['command']}`. {len(rows)} committed GPU A/Bs decided faster or slower, with profiled "
             f"GPU idle. The naive rule (the gain is at most the GPU idle the fix removes, at the far ends of the "
             f"profiled ranges) lies below the near end of the measured interval in **{len(bad)}** of them; in "
             f"**{len(same_work)}** of those the fix left the GPU's kernels and copies as they were, which is the "
             "case the rule is meant for (host-device copies as they were, up to "
             f"{SAME_COPIES} per step, and kernel launches within {SAME_LAUNCHES:.0%}). Each row is a verdict the "
             "naive rule would have contradicted: the lab's bound (`lab.verdicts.bound`) holds the call against its "
             "GPU's busy time instead.", "",
             "| result | verdict | test/control [interval] | naive bound | gain at the interval's near end | "
             "GPU work changed |", "|---|---|---|---|---|---|"]
    for x in sorted(bad, key=lambda x: (bool(x["gpu_work_changed"]), x["result"])):
        lines.append(f"| [{x['result']}](../{Path(x['result']).with_suffix('.md')}) | {x['verdict']} | "
                     f"{x['ratio']:.4f} [{x['ci'][0]:.4f}, {x['ci'][1]:.4f}] | {x['bound']:.2%} | "
                     f"{x['near_end']:.2%} | {', '.join(x['gpu_work_changed']) or 'no'} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"{len(rows)} checked, {len(bad)} contradicted ({len(same_work)} with the same GPU work); wrote "
          f"{args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

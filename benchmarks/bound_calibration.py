"""Calibration of the trace's bound (`lab.verdicts.bound`): does the bound hold the effect the blocks measure?

    python benchmarks/bound_calibration.py --out results/bound/calibration_h200 [--quick]

Each trial is one A/B through the lab's own engine (`lab.measure.ab.run`) with `bound="check"`: the bound is read
after the paired profiles, and the blocks are timed anyway, so that each trial holds both. The trials:

- **A/A**: both arms run the same code. The bound must hold the measured ratio (whose true value is 1), and where
  the call keeps its GPU busy it decides equivalence;
- **positive controls**: the control arm has a host stall of known cost at every step end (a device sync and a
  sleep, `lab.run.instrument.InjectedStall`: what a fix that removes a host stall removes), sized as a share of the
  call; the test arm is faster by that much, and the bound must reach at least as far as the measured gain, and
  never decide equivalence where the stall is beyond the margin;
- **a real fix**: a catalog fix on the same build, bound and blocks both read.

Two builds: Wan 2.1 14B's true per-layer shapes at its true call (480x832, 81 frames), few layers and steps (a call
its GPU keeps busy), and the same with the tiny call (a call that leaves its GPU idle between kernels). Each trial
says whether the bound held the blocks' estimate and its interval; a contradiction is reported, never dropped.
Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (name, call, layers, steps): the builds, as `lab.run.scenario.build` takes them
BUILDS = [("gpu-bound", "full", 2, 2), ("host-bound", "tiny", 2, 2)]
#: the positive controls' stall, as a share of the control's call
STALLS = (0.005, 0.02, 0.05)


def trial(built, name: str, stall_share: float, fix: str | None, call_ms: float, config, trace_dir: Path) -> dict:
    from lab.apply.fix import get_fix
    from lab.measure import ab
    from lab.run.instrument import injected_stall
    from lab.run.runner import CompileSpec
    from lab.verdicts.bound import TraceBound

    stall_ms = stall_share * call_ms / built.steps if stall_share else 0.0
    hook = injected_stall(built.device, stall_ms) if stall_ms else None
    control = ab.Arm("control", [], hook=hook)
    test = ab.Arm("test", [get_fix(fix)] if fix else [])
    started = time.perf_counter()
    out = ab.run(built, CompileSpec("eager"), control, test, config, trace_dir, f"bound_{name}", print)
    s, b = out.get("stats") or {}, out.get("bound") or {}
    ratio, ci = s.get("ratio"), s.get("ci")
    lo, hi = b.get("lo"), b.get("hi")
    usable = bool(b) and not b.get("reason")
    decided = usable and TraceBound.from_dict(b).decided
    return {"trial": name, "fix": fix, "stall_ms": stall_ms, "stall_share": stall_share,
            "expected_ratio": 1 / (1 + stall_share) if stall_share else (None if fix else 1.0),
            "verdict": out["verdict"].value, "ratio": ratio, "ci": ci, "blocks": s.get("n"),
            "bound": {**{k: b.get(k) for k in ("lo", "hi", "reason", "control_wall_ms", "test_wall_ms",
                                               "control_busy_ms", "test_busy_ms")}, "decided": decided},
            "estimate_inside": bool(usable and ratio is not None and lo <= ratio <= hi),
            "interval_meets": bool(usable and ci is not None and ci[0] <= hi and ci[1] >= lo),
            "bound_decided_wrongly": bool(decided and out["verdict"].changed_speed),
            "seconds": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bound" / "calibration")
    parser.add_argument("--quick", action="store_true", help="the tiny pipeline on this machine (a check of the script)")
    parser.add_argument("--fix", default="unipc_host_coeffs", help="the real fix tried on each build")
    args = parser.parse_args()

    import torch

    from lab.measure.config import ABConfig
    from lab.run.runner import timed_call
    from lab.run.scenario import build, get_scenario
    from lab.verdicts import stats

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    size = "full" if device == "cuda" else "tiny"
    config = ABConfig(blocks=6, lead_in=1, repeat=1, profile_calls=2, with_stack=False, bound="check")
    trace_dir = Path("traces") / "bound"
    trials = []
    for name, call, layers, steps in BUILDS if device == "cuda" else BUILDS[:1]:
        built = build(get_scenario("wan"), size=size, device=device, layers=layers if size == "full" else None,
                      steps=steps, call=call if size == "full" else None)
        built.pipe.set_progress_bar_config(disable=True)
        for _ in range(2):
            timed_call(built, seed=0, marks=False)
        call_ms = stats.median([timed_call(built, seed=0, marks=False).wall_ms for _ in range(3)])
        print(f"== {name}: a call takes {call_ms:,.1f} ms", flush=True)
        plan = [("A/A", 0.0, None), ("A/A again", 0.0, None)] + [(f"stall {s:.1%}", s, None) for s in STALLS]
        plan.append((f"fix {args.fix}", 0.0, args.fix))
        for label, share, fix in plan:
            found = trial(built, f"{name} {label}", share, fix, call_ms, config, trace_dir)
            found["build"] = {"name": name, "call": call, "layers": layers, "steps": steps, "call_ms": call_ms}
            trials.append(found)
            print(json.dumps({k: found[k] for k in ("trial", "verdict", "ratio", "bound", "estimate_inside")}),
                  flush=True)
            write(args.out, trials, config, device)  # after every trial: a time limit keeps the trials done
        del built
        torch.cuda.empty_cache() if device == "cuda" else None
    report = write(args.out, trials, config, device)
    print(f"wrote {args.out.with_suffix('.json')} and .md; contradictions: {report['contradictions'] or 'none'}")
    return 0


def write(out: Path, trials: list[dict], config, device: str) -> dict:
    from lab.results import store
    from lab.run import copy_rates

    env = store.environment(device, copy_rates.rates(device))
    report = {"command": "python benchmarks/bound_calibration.py " + " ".join(sys.argv[1:]),
              "environment": {**{k: env.get(k) for k in ("gpu", "driver", "torch", "diffusers", "cpus", "copy_rates")},
                              "host": platform.node()},
              "config": {"blocks": config.blocks, "repeat": config.repeat, "profile_calls": config.profile_calls},
              "trials": trials,
              "contradictions": [t["trial"] for t in trials if t["bound"]["reason"] == "" and not t["estimate_inside"]],
              "decided_wrongly": [t["trial"] for t in trials if t["bound_decided_wrongly"]]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(page(report))
    return report


def page(report: dict) -> str:
    env = report["environment"]
    lines = ["# The trace's bound against the blocks", "",
             f"{env['gpu'] or 'CPU'}, driver {env['driver']}, torch {env['torch']}, diffusers {env['diffusers']}, "
             f"{env['cpus']} CPUs. Command: `{report['command']}`. Each trial: the bound read from "
             f"{report['config']['profile_calls']} profiled calls per arm and the unprofiled calls, then "
             f"{report['config']['blocks']} timing blocks anyway (`bound=\"check\"`).", "",
             "| build | trial | call | bound [lo, hi] | decides | blocks: ratio [interval] | verdict | estimate inside |",
             "|---|---|---|---|---|---|---|---|"]
    for t in report["trials"]:
        b = t["bound"]
        bound = "none: " + b["reason"] if b["reason"] else f"[{b['lo']:.4f}, {b['hi']:.4f}]"
        ci = f"[{t['ci'][0]:.4f}, {t['ci'][1]:.4f}]" if t["ci"] else "n/a"
        ratio = f"{t['ratio']:.4f} {ci}" if t["ratio"] is not None else "n/a"
        lines.append(f"| {t['build']['name']} | {t['trial'].split(' ', 1)[1]} | {t['build']['call_ms']:,.1f} ms | "
                     f"{bound} | {'yes' if b['decided'] else 'no'} | {ratio} | {t['verdict']} | "
                     f"{'yes' if t['estimate_inside'] else '**no**' if not b['reason'] else 'n/a'} |")
    lines += ["", f"Contradictions (the blocks' estimate outside the bound): {', '.join(report['contradictions']) or 'none'}.",
              f"Equivalence decided by the bound where the blocks found a change: "
              f"{', '.join(report['decided_wrongly']) or 'none'}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

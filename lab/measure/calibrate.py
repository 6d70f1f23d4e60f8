"""`lab calibrate`: the A/B engine's false-positive rate (A/A) and power (a positive control of known cost), with
the decision rule exactly as `lab ab` uses it: a sequential design looks after every block, so every look counts.

- A/A: K comparisons in which both arms run the same code. The share called faster or slower estimates the
  false-positive rate; it should not exceed alpha by more than its sampling error sqrt(alpha (1 - alpha) / K).
- Positive control: K comparisons in which the control arm has an injected per-step host stall (a device sync plus
  a sleep of known cost) and the test arm does not. The share called faster estimates the power.

Each trial records how many blocks and how many seconds of blocks it took to decide.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from lab.measure import ab
from lab.run.runner import timed_call
from lab.run.scenario import Built
from lab.verdicts import stats


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    trials: int = 40
    timing: ab.ABConfig = ab.ABConfig(profile=False)  # the design and block layout, as `lab ab` would use them
    stall_ms: float = 0.5  # injected per-step cost of the positive control


def _trials(built: Built, control: ab.Arm, test: ab.Arm, config: CalibrationConfig, label: str,
            progress: Callable[[str], None]) -> list[dict]:
    out = []
    stall = control.hook if isinstance(control.hook, ab.InjectedStall) else None
    for k in range(config.trials):
        abc = dataclasses.replace(config.timing, seed=config.timing.seed + k, profile=False)
        before = stall.ran if stall else 0
        bench = ab.benchmark(built, [control, test], abc, lambda _: None)
        c, t = bench["samples"]["control"]["wall_ms"], bench["samples"]["test"]["wall_ms"]
        if not c:
            break
        comp = stats.compare(c, t, design=abc.design(), margin=abc.margin)
        out.append({"trial": k, "verdict": comp.verdict, "direction": comp.direction, "ratio": comp.ratio, "ci": list(comp.ci),
                    "ci_equivalence": list(comp.ci_equivalence), "blocks": comp.n,
                    "seconds": sum(bench["block_s"]), "stopped": bench["stopped"], "control_ms": c, "test_ms": t,
                    "stalls_ran": (stall.ran - before) if stall else 0})
        # print the interval the verdict rests on: the equivalence interval for an equivalence call
        lo, hi = comp.ci_equivalence if comp.equivalent else comp.ci
        level = comp.level_equivalence if comp.equivalent else comp.level
        progress(f"  {label} {k + 1}/{config.trials}: {comp.verdict} after {comp.n} blocks ({sum(bench['block_s']):.1f} s), "
                 f"ratio {comp.ratio:.4f}, {level} CI [{lo:.4f}, {hi:.4f}]")
        if bench["interrupted"]:
            break
    return out


def _effort(trials: list[dict]) -> dict:
    blocks = [t["blocks"] for t in trials]
    seconds = [t["seconds"] for t in trials]
    return {"blocks_median": stats.median(blocks) if blocks else None, "blocks_max": max(blocks, default=None),
            "seconds_median": stats.median(seconds) if seconds else None, "seconds_max": max(seconds, default=None),
            "seconds_total": sum(seconds)}


def calibrate(built: Built, config: CalibrationConfig, progress: Callable[[str], None]) -> dict:
    design = config.timing.design()
    progress("warming up ...")
    for _ in range(2):
        timed_call(built, marks=False)
    progress(f"A/A: {config.trials} comparisons of identical arms; {config.timing.describe()}")
    same = ab.Arm("control", []), ab.Arm("test", [])
    aa = _trials(built, *same, config, "A/A", progress)
    progress(f"positive control: a {config.stall_ms} ms host stall per step, removed in the test arm")
    stalled = ab.Arm("control", [], hook=ab.injected_stall(built.device, config.stall_ms)), ab.Arm("test", [])
    pos = _trials(built, *stalled, config, "positive", progress)

    alpha = design.alpha
    false_pos = sum(1 for t in aa if t["direction"] is not None)
    detected = sum(1 for t in pos if t["direction"] == "faster")
    n_aa, n_pos = len(aa), len(pos)
    sampling_error = math.sqrt(alpha * (1 - alpha) / n_aa) if n_aa else float("nan")
    fpr = false_pos / n_aa if n_aa else float("nan")
    calls = [sum(t["control_ms"]) / len(t["control_ms"]) for t in aa]
    return {
        "design": design.to_dict(), "block_layout": config.timing.describe(),
        "aa": {"trials": n_aa, "false_positives": false_pos, "rate": fpr, "rate_ci95": wilson(false_pos, n_aa),
               "alpha": alpha, "sampling_error": sampling_error,
               "within_alpha_plus_sampling_error": bool(fpr <= alpha + sampling_error),
               "verdicts": _count(t["verdict"] for t in aa), **_effort(aa)},
        "positive": {"trials": n_pos, "detected": detected, "power": detected / n_pos if n_pos else float("nan"),
                     "power_ci95": wilson(detected, n_pos), "stall_ms_per_step": config.stall_ms,
                     "steps": built.steps, "expected_effect_ms": config.stall_ms * built.steps,
                     "median_ratio": stats.median([t["ratio"] for t in pos]) if pos else None,
                     "verdicts": _count(t["verdict"] for t in pos), **_effort(pos)},
        "call_ms_median": stats.median(calls) if calls else None,
        "trials": {"aa": aa, "positive": pos},
    }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _effort_text(part: dict) -> str:
    if part.get("blocks_median") is None:
        return "n/a"
    return (f"{part['blocks_median']:g} blocks (max {part['blocks_max']}), {part['seconds_median']:.1f} s "
            f"(max {part['seconds_max']:.1f} s)")


def markdown(result: dict) -> str:
    aa, pos = result["aa"], result["positive"]
    env = result["environment"]
    lo, hi = aa["rate_ci95"]
    plo, phi = pos["power_ci95"]
    ok = "within" if aa["within_alpha_plus_sampling_error"] else "ABOVE"
    design = stats.Design.from_dict(result["design"]) if "design" in result else None
    rule = (f"Rule as `lab ab` uses it: {design.describe()}. Blocks: {result['block_layout']}." if design
            else "Rule: the fixed-design signed-rank test this calibration was made with (before the sequential rule).")
    return "\n".join([
        f"# Calibration of `lab ab` on `{result['scenario']}` ({result['size']}"
        f"{', %d blocks' % result['layers'] if result.get('layers') else ''}, {result['mode']}, {result['steps']} steps)", "",
        f"Machine: {env.get('gpu')}, {env.get('cpus')} CPUs; torch {env['torch']}, diffusers {env['diffusers']}, "
        f"lab {env['lab_commit']}. One call takes {result['call_ms_median']:.1f} ms (median).", "",
        rule, "",
        "| check | trials | result | 95% CI (Wilson) | to a verdict, median |", "|---|---|---|---|---|",
        f"| A/A false-positive rate at alpha {aa['alpha']} | {aa['trials']} | {aa['false_positives']} / {aa['trials']} = "
        f"{aa['rate']:.3f} ({ok} alpha + sampling error {aa['alpha'] + aa['sampling_error']:.3f}) | {lo:.3f}–{hi:.3f} | "
        f"{_effort_text(aa)} |",
        f"| power: {pos['stall_ms_per_step']} ms stall per step ({pos['expected_effect_ms']:.1f} ms per call) removed | "
        f"{pos['trials']} | {pos['detected']} / {pos['trials']} = {pos['power']:.3f} called faster (median ratio "
        f"{pos['median_ratio']:.4f}) | {plo:.3f}–{phi:.3f} | {_effort_text(pos)} |", "",
        f"A/A verdicts: {aa['verdicts']}. Positive-control verdicts: {pos['verdicts']}.", "",
        f"Command: `{result['command']}`", "",
    ])

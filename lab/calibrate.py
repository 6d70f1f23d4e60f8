"""`lab calibrate`: the A/B engine's false-positive rate (A/A) and power (a positive control of known cost).

- A/A: K comparisons in which both arms run the same code. The share called significant at `alpha` estimates the
  false-positive rate; it should not exceed alpha by more than its sampling error sqrt(alpha (1 - alpha) / K).
- Positive control: K comparisons in which the control arm has an injected per-step host stall (a device sync plus
  a sleep of known cost) and the test arm does not. The share called "faster" estimates the power.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from lab import ab, stats
from lab.runner import timed_call
from lab.scenario import Built


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    trials: int = 40
    blocks: int = 12  # with 12 pairs one disturbed block still leaves p < 0.05 for a clear effect (10: p = 0.084)
    warmup: int = 1
    repeat: int = 3
    alpha: float = 0.05
    margin: float = 0.01
    stall_ms: float = 0.5  # injected per-step cost of the positive control
    seed: int = 0


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _trials(built: Built, control: ab.Arm, test: ab.Arm, config: CalibrationConfig, label: str,
            progress: Callable[[str], None]) -> list[dict]:
    out = []
    for k in range(config.trials):
        abc = ab.ABConfig(blocks=config.blocks, warmup=config.warmup, repeat=config.repeat, alpha=config.alpha, margin=config.margin,
                          seed=config.seed + k, profile=False)
        bench = ab.benchmark(built, [control, test], abc, lambda _: None)
        c, t = bench["samples"]["control"]["wall_ms"], bench["samples"]["test"]["wall_ms"]
        comp = stats.compare(c, t, alpha=config.alpha, margin=config.margin, seed=config.seed + k)
        out.append({"trial": k, "verdict": comp.verdict, "p": comp.p_wilcoxon, "ratio": comp.ratio_median,
                    "control_ms": c, "test_ms": t})
        progress(f"  {label} {k + 1}/{config.trials}: {comp.verdict} (ratio {comp.ratio_median:.4f}, p = {comp.p_wilcoxon:.3g})")
        if bench["interrupted"]:
            break
    return out


def calibrate(built: Built, config: CalibrationConfig, progress: Callable[[str], None]) -> dict:
    if stats.min_p_signed_rank(config.blocks) >= config.alpha:
        from lab.errors import UsageError

        raise UsageError(f"{config.blocks} blocks cannot reach p < {config.alpha}; use at least "
                         f"{stats.blocks_needed(config.alpha)}.")
    progress("warming up ...")
    for _ in range(2):
        timed_call(built, marks=False)
    progress(f"A/A: {config.trials} comparisons of identical arms, {config.blocks} blocks each")
    same = ab.Arm("control", []), ab.Arm("test", [])
    aa = _trials(built, *same, config, "A/A", progress)
    progress(f"positive control: a {config.stall_ms} ms host stall per step, removed in the test arm")
    stalled = ab.Arm("control", [], hook=ab.injected_stall(built.device, config.stall_ms)), ab.Arm("test", [])
    pos = _trials(built, *stalled, config, "positive", progress)

    false_pos = sum(1 for t in aa if t["verdict"] in ("faster", "slower"))
    detected = sum(1 for t in pos if t["verdict"] == "faster")
    n_aa, n_pos = len(aa), len(pos)
    sampling_error = math.sqrt(config.alpha * (1 - config.alpha) / n_aa) if n_aa else float("nan")
    fpr = false_pos / n_aa if n_aa else float("nan")
    calls = [sum(t["control_ms"]) / len(t["control_ms"]) for t in aa]
    return {
        "aa": {"trials": n_aa, "false_positives": false_pos, "rate": fpr, "rate_ci95": wilson(false_pos, n_aa),
               "alpha": config.alpha, "sampling_error": sampling_error,
               "within_alpha_plus_sampling_error": bool(fpr <= config.alpha + sampling_error),
               "verdicts": _count(t["verdict"] for t in aa)},
        "positive": {"trials": n_pos, "detected": detected, "power": detected / n_pos if n_pos else float("nan"),
                     "power_ci95": wilson(detected, n_pos), "stall_ms_per_step": config.stall_ms,
                     "steps": built.steps, "expected_effect_ms": config.stall_ms * built.steps,
                     "median_ratio": stats.median([t["ratio"] for t in pos]) if pos else None,
                     "verdicts": _count(t["verdict"] for t in pos)},
        "call_ms_median": stats.median(calls) if calls else None,
        "trials": {"aa": aa, "positive": pos},
    }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def markdown(result: dict) -> str:
    aa, pos = result["aa"], result["positive"]
    env = result["environment"]
    lo, hi = aa["rate_ci95"]
    plo, phi = pos["power_ci95"]
    ok = "within" if aa["within_alpha_plus_sampling_error"] else "ABOVE"
    return "\n".join([
        f"# Calibration of `lab ab` on `{result['scenario']}` ({result['size']}"
        f"{', %d blocks' % result['layers'] if result.get('layers') else ''}, {result['mode']}, {result['steps']} steps)", "",
        f"Machine: {env.get('gpu')}, {env.get('cpus')} CPUs; torch {env['torch']}, diffusers {env['diffusers']}, "
        f"lab {env['lab_commit']}. One call takes {result['call_ms_median']:.1f} ms (median).", "",
        "| check | trials | result | 95% CI (Wilson) |", "|---|---|---|---|",
        f"| A/A false-positive rate at alpha {aa['alpha']} | {aa['trials']} | {aa['false_positives']} / {aa['trials']} = "
        f"{aa['rate']:.3f} ({ok} alpha + sampling error {aa['alpha'] + aa['sampling_error']:.3f}) | {lo:.3f}–{hi:.3f} |",
        f"| power: {pos['stall_ms_per_step']} ms stall per step ({pos['expected_effect_ms']:.1f} ms per call) removed | "
        f"{pos['trials']} | {pos['detected']} / {pos['trials']} = {pos['power']:.3f} called faster (median ratio "
        f"{pos['median_ratio']:.4f}) | {plo:.3f}–{phi:.3f} |", "",
        f"A/A verdicts: {aa['verdicts']}. Positive-control verdicts: {pos['verdicts']}.", "",
        f"Command: `{result['command']}`", "",
    ])

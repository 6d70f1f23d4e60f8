"""`lab sweep`: the A/B at each point of a varied call parameter, to show where (if anywhere) a fix matters.

On a big GPU-bound call a removed sync or CPU gap is often hidden behind queued GPU work; on a small one it shows.
A sweep varies one setting (resolution, frames, batch, steps, compile mode), runs the same A/B at each point and
plots the effect with its CI against the setting.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lab.base.errors import LabError, UsageError, known_hint
from lab.measure import ab
from lab.run.runner import CompileSpec, apply_compile
from lab.run.scenario import Built, resolve
from lab.verdicts.verdict import Verdict

#: what `--vary KEY=...` accepts, and what it sets
KEYS = ("height", "width", "size", "frames", "batch", "steps", "compile")


def parse_vary(spec: str) -> tuple[str, list[Any]]:
    """`height=256,512,1024` -> ("height", [256, 512, 1024])."""
    key, sep, values = spec.partition("=")
    key = key.strip()
    if not sep or not values:
        raise UsageError(f"`--vary {spec}`: expected KEY=V1,V2,... (keys: {', '.join(KEYS)}).")
    if key not in KEYS:
        from lab.base.errors import unknown_name

        raise unknown_name("sweep key", key, KEYS)
    items = [v.strip() for v in values.split(",") if v.strip()]
    if key == "compile":
        allowed = ("eager", "default", "reduce-overhead", "max-autotune")
        bad = [v for v in items if v not in allowed]
        if bad:
            raise UsageError(f"`--vary compile=`: unknown mode(s) {bad}; choose from {', '.join(allowed)}.")
        return key, items
    try:
        return key, [int(v) for v in items]
    except ValueError as e:
        raise UsageError(f"`--vary {spec}`: values must be integers.") from e


def apply_point(built: Built, key: str, value: Any, base: CompileSpec) -> CompileSpec:
    """Set one sweep point on a freshly built scenario; returns the compile spec to use."""
    kwargs = built.call_kwargs
    params = inspect.signature(resolve(built.scenario.pipeline_cls).__call__).parameters
    if key in ("height", "size"):
        kwargs["height"] = value
    if key in ("width", "size"):
        kwargs["width"] = value
    if key == "frames":
        if "num_frames" not in params:
            raise UsageError(f"`{built.scenario.name}` makes images: it has no frames to vary.")
        kwargs["num_frames"] = value
    if key == "batch":
        name = next((n for n in ("num_images_per_prompt", "num_videos_per_prompt") if n in params), None)
        if name is None:
            raise UsageError(f"`{built.scenario.name}` takes no per-prompt batch size.")
        kwargs[name] = value
    if key == "steps":
        kwargs["num_inference_steps"] = value
        built.steps = value
    if key == "compile":
        return CompileSpec(mode="eager") if value == "eager" else dataclasses.replace(base, mode="compile", compile_mode=value)
    return base


def sweep(build_point: Callable[[], Built], fixes: list, key: str, values: list, base: CompileSpec,
          config: ab.ABConfig, trace_dir: Path, stem: str, progress: Callable[[str], None]) -> list[dict]:
    """Run the A/B at each point (a fresh build per point, so compile state does not leak between points). Ctrl-C
    stops the sweep with the points done so far (the interrupted point keeps its complete blocks)."""
    points = []
    for value in values:
        progress(f"== {key} = {value}")
        built = spec = None
        try:
            built = build_point()
            spec = apply_point(built, key, value, base)
            apply_compile(built, spec)
            outcome = ab.run(built, spec, ab.Arm("control", []), ab.Arm("test", fixes), config, trace_dir,
                             f"{stem}_{key}{value}", progress)
        except KeyboardInterrupt:
            progress(f"  interrupted: keeping the {len(points)} point(s) done")
            break
        except LabError:
            raise
        except Exception as e:  # one point failing (out of memory, a compile mode that breaks) keeps the others
            summary = f"{type(e).__name__}: {e}{known_hint(e)}"
            progress(f"  {key} = {value} failed: {summary}")
            points.append({"value": value, "mode": spec.describe() if spec else None, "verdict": Verdict.FAILED,
                           "summary": summary, "stats": None,
                           "metrics": None, "samples": None, "verify": None, "warnings": []})
            continue
        finally:
            del built
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        points.append({"value": value, "mode": spec.describe(), "verdict": outcome["verdict"],
                       "summary": outcome["summary"], "stats": outcome.get("stats"),
                       "metrics": (outcome.get("profile") or {}).get("metrics"),
                       "samples": outcome.get("samples"), "verify": outcome["verify"],
                       "warnings": outcome.get("warnings", []), "interrupted": bool(outcome.get("interrupted")),
                       "order_effect": outcome.get("order_effect"),
                       **{k: outcome.get(k) for k in ("order", "stopped", "block_s", "design", "bound")}})
        if outcome.get("interrupted"):  # Ctrl-C in the point's blocks: it keeps them, and the sweep stops there
            progress(f"  interrupted: keeping the {len(points)} point(s) done")
            break
    return points

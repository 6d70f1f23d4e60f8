"""`lab run`: build a scenario and time one call."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.base import files, outputs
from lab.commands._options import compile_options, scenario_options
from lab.commands._shared import command_line, prepared, progress

HELP = "build a scenario and time one call"


def add_arguments(p: argparse.ArgumentParser) -> None:
    scenario_options(p)
    compile_options(p)
    p.add_argument("--fix", default="", help="fixes to apply: NAME[,NAME..] or all")
    p.add_argument("--warmup", type=int, default=0, help="untimed calls before the timed one (default 0; 1 when compiling)")
    p.add_argument("--json", help="write the stage and per-step timing report (JSON) here")


def run(args: argparse.Namespace) -> int:
    import torch

    from lab.apply.fix import applied, exercised
    from lab.apply.patching import CallCounter
    from lab.run.runner import check_finite, timed_call

    if args.json:  # where the report goes, before anything is built
        outputs.check(Path(args.json).parent, [Path(args.json).name], option="--json")
    scenario, fixes, built, spec = prepared(args)
    counter = CallCounter()
    with applied(fixes, built.pipe, counter):
        for i in range(args.warmup + (1 if spec.mode == "compile" and args.warmup == 0 else 0)):
            progress(f"warm-up call {i + 1}{' (compiling)' if spec.mode == 'compile' and i == 0 else ''} ...")
            timed_call(built, seed=args.seed, marks=False)
        if built.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        result = timed_call(built, seed=args.seed)
    peak = torch.cuda.max_memory_allocated() if built.device.startswith("cuda") else None
    print(f"{scenario.name}: {result.wall_ms / 1e3:.3f} s per call ({built.size}, {spec.describe()}, {built.steps} steps, "
          f"device {built.device}), output {tuple(result.output.shape)} {result.output.dtype}")
    if fixes:
        print("fixes: " + ", ".join(f"{f.name} (its code ran {exercised(f, counter)} times)" for f in fixes))
    bad = check_finite(result.output)
    if bad:
        print(f"WARNING: {bad}; the random weights do not keep activations finite at this size.")
    if args.json:
        report = {
            "scenario": scenario.name, "size": built.size, "build": built.build, "settings": built.settings,
            "steps": built.steps,
            "mode": spec.describe(),
            "device": built.device, "wall_ms": result.wall_ms, "steps_ms": result.steps_ms,
            "stages_ms": result.stages_ms, "output_shape": list(result.output.shape), "peak_gpu_bytes": peak,
            "params": built.params, "fixes": [f.name for f in fixes], "warmup": args.warmup,
            "gpu": torch.cuda.get_device_name() if built.device.startswith("cuda") else None,
            "finite": bad is None, "command": command_line(),
        }
        files.write_text(args.json, json.dumps(report, indent=2))
        progress(f"wrote {args.json}")
    return 0

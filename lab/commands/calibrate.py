"""`lab calibrate`: how often `lab ab` calls an A/A comparison significant, and how often it finds a known stall."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from lab.base import naming
from lab.base.errors import UsageError
from lab.commands._options import compile_options, scenario_options, timing_options
from lab.commands._shared import (
    ab_config,
    build_from_args,
    command_line,
    compile_spec,
    device_tag,
    progress,
    quietly,
    save_report,
    say_where_output_went,
    size_tag,
)

HELP = "A/A false-positive rate and positive-control power of `lab ab`"


def add_arguments(p: argparse.ArgumentParser) -> None:
    scenario_options(p)
    compile_options(p)
    p.add_argument("--trials", type=int, default=40, help="comparisons of each kind (default 40)")
    timing_options(p)
    p.add_argument("--stall-ms", type=float, default=0.5, help="positive control: injected host stall per step (ms)")
    p.add_argument("--out", default="results/calibration")
    p.add_argument("--name")
    p.add_argument("--replace", action="store_true")


def run(args: argparse.Namespace) -> int:
    from lab import results
    from lab.measure import calibrate
    from lab.run.runner import apply_compile
    from lab.run.scenario import default_device, get_scenario

    scenario = get_scenario(args.pipeline)
    device = args.device or default_device()
    size = size_tag(args, device)
    if args.trials < 1:
        raise UsageError("`--trials` must be at least 1.")
    timing = ab_config(args)
    name = args.name or naming.calibration_name(scenario.name, args.mode, size, device_tag(device))
    path = Path(args.out) / f"{name}.json"
    if path.exists() and not args.replace:  # before the build, which can take minutes
        raise UsageError(f"{path} already exists: pass --replace to overwrite it.")
    built = build_from_args(args, scenario)
    spec = compile_spec(args)
    apply_compile(built, spec)
    config = calibrate.CalibrationConfig(trials=args.trials, timing=timing, stall_ms=args.stall_ms)
    log = Path("traces") / f"calibrate_{name}.log"
    with quietly(log):
        outcome = calibrate.calibrate(built, config, progress)
    say_where_output_went(log)
    result = {"format": results.FORMAT_VERSION, "kind": "calibration", "name": name, "created": results.now(),
              "command": command_line(), "scenario": scenario.name, "size": built.size, "layers": built.layers,
              "build": built.build, "steps": built.steps, "mode": spec.describe(),
              "config": dataclasses.asdict(config),
              "environment": results.environment(built.device), **outcome}
    save_report(path, result, calibrate.markdown(result))
    return 0

"""`lab calibrate`: how often `lab ab` calls an A/A comparison significant, and how often it finds a known stall."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from lab.base import naming, outputs
from lab.base.errors import UsageError
from lab.commands._options import compile_options, scenario_options, timing_options
from lab.commands._shared import (
    ab_config,
    build_from_args,
    command_line,
    device_tag,
    progress,
    quietly,
    read_result,
    run_of,
    save_report,
    say_where_output_went,
    size_tag,
)
from lab.run import copy_rates

HELP = "A/A false-positive rate and positive-control power of `lab ab`"


def add_arguments(p: argparse.ArgumentParser) -> None:
    scenario_options(p, pipeline_required=False)  # not with --merge
    compile_options(p)
    p.add_argument("--trials", type=int, default=40, help="comparisons of each kind (default 40)")
    timing_options(p)
    p.add_argument("--stall-ms", type=float, default=0.5, help="positive control: injected host stall per step (ms)")
    p.add_argument("--positive", action=argparse.BooleanOptionalAction, default=True,
                   help="a positive-control trial after each A/A trial (default on)")
    p.add_argument("--isolate", action="store_true",
                   help="calibrate the cross-process design (`lab ab --isolate`, two diffusers, `lab history`): both "
                        "arms in worker processes of their own running the same code, a fresh pair per block "
                        "(with --one-pair: one pair per trial, the design before fresh pairs)")
    p.add_argument("--out", default="results/calibration")
    p.add_argument("--name")
    p.add_argument("--replace", action="store_true", help="overwrite an existing calibration")
    p.add_argument("--resume", action="store_true",
                   help="go on from the trials of an existing calibration that stopped (same settings and software; "
                        "with --replace too, afresh where it cannot)")
    p.add_argument("--merge", action="append", metavar="FILE", default=[],
                   help="add the trials of FILE, another run of a calibration in --out of the same name (same "
                        "settings and software) that went on from the same earlier trials, on another GPU or in "
                        "another call, to that calibration; measures nothing (repeatable)")


#: what a calibration records of its run's build (`lab.run.description.Run.header`)
CALIBRATION_HEADER = ("size", "layers", "build", "settings", "steps", "mode")


def run(args: argparse.Namespace) -> int:
    import msgspec

    from lab import results
    from lab.base import files
    from lab.measure import calibrate
    from lab.pages import calibration_report
    from lab.results.schema import CalibrationResult
    from lab.run.runner import apply_compile
    from lab.run.scenario import default_device, get_scenario

    if args.merge:
        return _merge(args)
    if not args.pipeline:
        raise UsageError("`--pipeline` is required (`lab scenarios` lists them), except with `--merge`.")
    scenario = get_scenario(args.pipeline)
    outputs.check_name(args.name)
    device = args.device or default_device()
    size = size_tag(args, device)
    if args.trials < 1:
        raise UsageError("`--trials` must be at least 1.")
    timing = ab_config(args)
    if args.one_pair and not args.isolate:
        raise UsageError("`--one-pair` pairs worker processes: it needs `--isolate`.")
    processes = ("__one-pair" if args.one_pair else "__processes") if args.isolate else ""
    name = args.name or naming.calibration_name(scenario.name, args.mode, size, device_tag(device)) + processes
    path = Path(args.out) / f"{name}.json"
    # where the calibration and its log go, before anything is built; the calibration is this run's until it ends
    outputs.check(args.out, [f"{name}.md", f"{name}.png"], claim=[f"{name}.json"])
    outputs.check("traces", [f"calibrate_{name}.log"], option="(its log folder)")
    config = calibrate.CalibrationConfig(trials=args.trials, timing=timing, stall_ms=args.stall_ms,
                                         isolated=args.isolate, positive=args.positive)
    run = run_of(args, scenario, device)
    run.check()
    spec = run.compile
    header = {"format": results.FORMAT_VERSION, "kind": "calibration", "name": name, "command": command_line(),
              "scenario": scenario.name, **{k: v for k, v in run.header().items() if k in CALIBRATION_HEADER},
              "config": dataclasses.asdict(config), "environment": results.environment(device, copy_rates.rates(device))}
    prior = None
    if path.exists() and args.resume:  # before the build, which can take minutes
        prior = read_result(path)
        problems = calibrate.resume_problems(prior, header)
        if problems and args.replace:  # as `lab ab --resume --replace`: afresh where it cannot go on
            progress(f"{path} cannot be gone on from (" + "; ".join(problems) + "): calibrating afresh (--replace)")
            prior = None
        elif problems:
            raise UsageError(f"{path} cannot be gone on from: " + "; ".join(problems) + ". Pass --replace to "
                             "calibrate afresh.")
    elif path.exists() and not args.replace:
        raise UsageError(f"{path} already exists: pass --resume to go on from its trials or --replace to overwrite it.")

    def result_of(outcome: dict) -> CalibrationResult:
        return msgspec.convert({**header, "created": results.now(), **outcome}, CalibrationResult,
                               from_attributes=True)

    def save(outcome: dict) -> None:  # after every trial: a run killed outright keeps what it completed
        result = result_of(outcome)
        results.write(path, result, replace=True)
        png = path.with_suffix(".png")  # drawn at the end; a page written before keeps showing the last one
        files.write_text(path.with_suffix(".md"), calibration_report.markdown(result, png.name if png.exists() else None))

    log = Path("traces") / f"calibrate_{name}.log"
    if args.isolate:
        warmup_calls = max(1, timing.warmup) + (1 if spec.mode == "compile" else 0) - 1
        arms = calibrate.in_processes(run, config, warmup_calls)
        with quietly(log):
            outcome = calibrate.calibrate(None, config, progress, arms=arms, steps=args.steps, prior=prior, save=save)
    else:
        built = build_from_args(args, scenario)
        apply_compile(built, spec)
        header.update(size=built.size, layers=built.layers, build=built.build, steps=built.steps)
        with quietly(log):
            outcome = calibrate.calibrate(built, config, progress, prior=prior, save=save)
    say_where_output_went(log)
    result = result_of(outcome)
    png = calibration_report.plot(result, path.with_suffix(".png"))
    save_report(path, result, calibration_report.markdown(result, png and png.name), extra=[png] if png else [])
    return 130 if result.interrupted else 0


def _merge(args: argparse.Namespace) -> int:
    """`--merge`: the calibration of the same name in `--out` takes the trials of the other runs that it lacks, and
    is summed up again (its machine, command and settings stay its own)."""
    import msgspec

    from lab import results
    from lab.base.errors import LabError
    from lab.measure import calibrate
    from lab.measure.ab import ABConfig
    from lab.pages import calibration_report
    from lab.results.schema import CalibrationResult

    if args.resume or args.replace:
        raise UsageError("`--merge` adds another run's trials to a calibration and measures nothing: leave out "
                         "`--resume` and `--replace`.")

    def read(name: Path) -> CalibrationResult:
        try:
            r = results.read(name)
        except LabError as e:
            raise UsageError(f"`--merge`: {e}") from None
        if not isinstance(r, CalibrationResult):
            raise UsageError(f"`--merge`: {name} is not a calibration result.")
        return r

    others = [Path(n) for n in args.merge]
    outputs.check_name(args.name)
    path = Path(args.out) / (f"{args.name}.json" if args.name else others[0].name)
    if not path.exists():
        raise UsageError(f"`--merge`: {path} does not exist: a merge adds trials to a calibration written before "
                         "(`--out` and `--name` say where).")
    outputs.check(args.out, [path.with_suffix(".md").name, path.with_suffix(".png").name], claim=[path.name])
    kept = read(path)
    aa, pos, added = list(kept.trials.aa), list(kept.trials.positive), []
    for name in others:
        if name.resolve() == path.resolve():
            raise UsageError(f"`--merge {name}` is the calibration it would be merged into.")
        other = read(name)
        problems = calibrate.resume_problems(kept, msgspec.to_builtins(other))
        if problems:
            raise UsageError(f"`--merge {name}` measured otherwise than {path}: " + "; ".join(problems) + ".")
        aa, n_aa = calibrate.merge_trials(aa, list(other.trials.aa))
        pos, n_pos = calibrate.merge_trials(pos, list(other.trials.positive))
        added.append(f"{n_aa} A/A and {n_pos} positive trial(s) from {name}")
        progress(f"{name}: {n_aa} A/A and {n_pos} positive trial(s) that {path} lacked")
    stored = dict(kept.config)
    config = calibrate.CalibrationConfig(**{**stored, "timing": ABConfig(**stored["timing"])})
    short = len(aa) < config.trials or (config.positive and len(pos) < config.trials)
    outcome = calibrate.summary(aa, pos, config, kept.steps, kept.processes, interrupted=short)
    note = " ".join(filter(None, [kept.note, f"Merged by `{command_line()}`: " + "; ".join(added) + "."]))
    merged = msgspec.convert({**msgspec.to_builtins(kept), **msgspec.to_builtins(outcome), "note": note},
                             CalibrationResult)
    png = calibration_report.plot(merged, path.with_suffix(".png"))
    save_report(path, merged, calibration_report.markdown(merged, png and png.name), extra=[png] if png else [])
    return 0

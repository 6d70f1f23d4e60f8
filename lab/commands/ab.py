"""`lab ab`: a fix (or a set, or each fix in turn) against the same build without it: verify, profile, time, decide."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from lab.commands._options import ab_options, compile_options, scenario_options
from lab.commands._shared import (ab_config, build_from_args, command_line, compile_spec, compiler_log, device_tag,
                                  fixes_for, progress, quietly, say_where_output_went, size_tag)
from lab import naming
from lab.errors import LabError, UsageError, describe_failure

HELP = "A/B a fix: verify outputs, paired profiles, interleaved timing, significance"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fix", action="append", metavar="SET",
                   help="NAME[,NAME..] or all (fixes that do not apply are skipped with a note), or each: every "
                        "applicable fix alone and then all together. Repeat --fix to compare several sets on one "
                        "build, one result each (results that exist are kept unless --replace)")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--isolate", action="store_true",
                   help="run each arm in its own worker process (each builds the pipeline; twice the memory)")
    p.add_argument("--control", choices=("off", "aa"), default="off",
                   help="off: control runs without the fixes; aa: both arms run the same code (calibration)")
    ab_options(p)
    p.add_argument("--out", default="results/ab", help="results directory (default results/ab)")
    p.add_argument("--name", help="result name (default: <fixes>__<mode>__<size>__<device>)")


def result_paths(out: Path, pipeline: str, name: str) -> dict[str, Path]:
    base = out / pipeline / name
    return {"json": base.with_suffix(".json"), "md": base.with_suffix(".md"), "png": base.with_suffix(".png")}


def write_result(result: dict, paths: dict[str, Path], replace: bool) -> None:
    from lab import report, results

    results.write(paths["json"], result, replace=replace)
    png = report.plot(result, paths["png"])
    paths["md"].write_text(report.markdown(result, png.name if png else None))


def fix_sets(scenario, specs: list[str]) -> list[tuple[list, list[str]]]:
    """The fix sets one `lab ab` compares, each with its notes: one per `--fix` (the named fixes together), and
    `each` for every applicable fix alone and then all together (`lab.fix.each_sets`). A set named twice runs once."""
    from lab.fix import each_sets

    sets: list[tuple[list, list[str]]] = []
    for spec in specs:
        if spec != "each":
            sets.append(fixes_for(scenario, spec, required=True))
            continue
        found = each_sets(scenario.name)
        if not found:
            raise UsageError(f"No fix applies to `{scenario.name}` on this diffusers; nothing to compare.")
        for note in found[-1][1]:
            progress(note)
        sets += found
    unique: dict[tuple[str, ...], tuple[list, list[str]]] = {}
    for fixes, notes in sets:
        unique.setdefault(tuple(f.name for f in fixes), (fixes, notes))
    return list(unique.values())


def run(args: argparse.Namespace) -> int:
    from lab import ab
    from lab.runner import apply_compile
    from lab.scenario import default_device, default_size, get_scenario

    scenario = get_scenario(args.pipeline)
    specs = args.fix or [""]
    sets = [([], [])] if args.control == "aa" else fix_sets(scenario, specs)
    each = len(sets) > 1 or "each" in specs
    if each and args.name:
        raise UsageError("`--name` names one result; with several fix sets every set gets its own default name.")
    if each and args.isolate:
        raise UsageError("`--isolate` builds the pipeline once per arm and run; run one fix set per command with it.")
    if args.control == "aa" and args.fix:
        raise UsageError("`--control aa` runs the same code in both arms: it takes no `--fix`.")
    config = ab_config(args)
    spec = compile_spec(args)
    device = args.device or default_device()
    size = args.size or default_size(device)
    planned = []
    for fixes, notes in sets:
        tag = naming.fix_tag([f.name for f in fixes])
        name = args.name or naming.ab_name([f.name for f in fixes], args.mode, size_tag(args, device), device_tag(device))
        paths = result_paths(Path(args.out), scenario.name, name)
        if paths["json"].exists() and not args.replace:
            if not each:
                raise UsageError(f"{paths['json']} already exists: pass --replace to overwrite it, or --name to write another.")
            progress(f"kept {paths['json']} (it exists; --replace runs it again)")
            continue
        planned.append((fixes, notes, tag, name, paths))
    if not planned:
        return 0
    if args.isolate:
        from lab.worker import IsolatedArm

        progress(f"starting one worker process per arm (each builds {scenario.name} at size `{size}` on {device}) ...")
        b = {"scenario": scenario.name, "size": size, "device": device, "dtype": args.dtype, "layers": args.layers,
             "steps": args.steps, "full_decode": args.full_decode, "checkpoint": args.checkpoint, "seed": args.seed,
             "call": args.call}
        built = None
        info = {"size": size, "layers": args.layers, "steps": args.steps, "device": device}
    else:
        started = time.perf_counter()
        built = build_from_args(args, scenario)
        apply_compile(built, spec)
        info = {"size": built.size, "layers": built.layers, "steps": built.steps, "device": built.device,
                "build_s": time.perf_counter() - started}

    def arms(fixes: list) -> tuple:
        if args.isolate:
            return IsolatedArm("control", [], b, dataclasses.asdict(spec)), IsolatedArm("test", fixes, b, dataclasses.asdict(spec))
        return ab.Arm("control", []), ab.Arm("test", fixes)

    failed = 0
    for i, (fixes, notes, tag, name, paths) in enumerate(planned):
        if each:
            progress(f"\n[{i + 1}/{len(planned)}] {scenario.name}: A/B of {tag}")
        try:
            result = _one(args, scenario, built, spec, arms(fixes), config, fixes, notes, name, info)
        except (LabError, KeyboardInterrupt):
            raise
        except Exception as e:  # with `each`, one fix set failing keeps the others' results
            if not each:
                raise
            print(f"ERROR: {tag}: {describe_failure(e)}", file=sys.stderr)
            failed += 1
            continue
        write_result(result, paths, replace=True)
        _print(result, scenario.name, tag, paths)
        failed += result["verdict"] == "outputs differ"
    return 1 if failed else 0


def _one(args, scenario, built, spec, arms, config, fixes, notes, name, info) -> dict:
    """One A/B run of one fix set over the shared build, as the result dict that `write_result` stores."""
    from lab import ab, results

    control, test = arms
    log = Path(args.trace_dir) / f"{scenario.name}_{name}.log"
    try:
        with quietly(log), compiler_log(spec if not args.isolate else None, Path(args.trace_dir),
                                        f"{scenario.name}_{name}") as compiled:
            outcome = ab.run(built, spec, control, test, config, Path(args.trace_dir), f"{scenario.name}_{name}", progress,
                             compile_log=compiled)
    finally:
        for arm in (control, test):
            if hasattr(arm, "close"):
                arm.close()
    say_where_output_went(log)
    return {
        "format": results.FORMAT_VERSION, "kind": "ab", "name": name, "created": results.now(),
        "command": command_line(),
        "scenario": scenario.name, "pipeline": scenario.pipeline_cls, "size": info["size"], "layers": info["layers"],
        "steps": info["steps"], "mode": spec.describe(), "compile": dataclasses.asdict(spec), "isolated": args.isolate,
        "fixes": [f.name for f in fixes], "control": args.control, "notes": notes,
        "config": dataclasses.asdict(config), "environment": results.environment(info["device"]),
        "build_s": info.get("build_s"), **outcome,
    }


def _print(result: dict, scenario: str, tag: str, paths: dict[str, Path]) -> None:
    from lab.report import metric_rows, time_accounting

    print(f"\n{scenario}, {tag}: {result['verdict'].upper()} — {result['summary']}")
    for row in metric_rows(result):
        print(f"  {row[0]}: {row[1]} -> {row[2]}")
    accounting = time_accounting(result)
    if accounting:
        print("  " + accounting)
    for w in result.get("warnings", []):
        print(f"  warning: {w}")
    print(f"wrote {paths['json']}, {paths['md'].name}, {paths['png'].name}")

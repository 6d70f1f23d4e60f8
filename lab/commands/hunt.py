"""`lab hunt`: every host-device sync of one call, merged from the profiler, CUDA sync debug mode and `lab scan`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.base import files, naming, outputs
from lab.base.errors import UsageError
from lab.commands._options import compile_options, scenario_options
from lab.commands._shared import (
    build_from_args,
    command_line,
    compile_spec,
    device_tag,
    fixes_for,
    progress,
    quietly,
    save_report,
    say_where_output_went,
    settings_of,
    size_tag,
)
from lab.run import copy_rates

HELP = "find every host-device sync of a pipeline call (profiler + sync debug mode + scan)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    scenario_options(p)
    compile_options(p)
    p.add_argument("--fix", default="", help="hunt with these fixes applied (NAME[,NAME..] or all)")
    p.add_argument("--baseline", action="store_true",
                   help="first hunt without the fixes (same build) and write a before/after comparison")
    p.add_argument("--out", default="results/hunt")
    p.add_argument("--name")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--trace-dir", default="traces")


def run(args: argparse.Namespace) -> int:
    import msgspec

    from lab import results
    from lab.apply.fix import applied
    from lab.measure import hunt
    from lab.measure.waste import compiler_notes
    from lab.results.schema import HuntResult
    from lab.run.runner import apply_compile, timed_call
    from lab.run.scenario import default_device, get_scenario

    if args.baseline and not args.fix:
        raise UsageError("--baseline compares a hunt without the fixes to one with them: name the fixes with --fix.")
    outputs.check_name(args.name)
    scenario = get_scenario(args.pipeline)
    fixes, _ = fixes_for(scenario, args.fix, settings=settings_of(args))
    if args.baseline and not fixes:
        raise UsageError(f"--baseline: none of `{args.fix}` applies to `{scenario.name}`, so there is nothing to compare.")
    arms = ([[]] if args.baseline else []) + [fixes]
    device = args.device or default_device()

    def name_of(fx: list) -> str:
        return args.name or naming.hunt_name(scenario.name, [f.name for f in fx], args.mode, size_tag(args, device),
                                             device_tag(device))

    names = [name_of(fx) + ("__before" if args.baseline and args.name and not fx else "") for fx in arms]
    paths = [Path(args.out) / f"{n}.json" for n in names]
    # where the hunts and their traces go, before anything is built; the hunts are this run's until it ends
    outputs.check(args.out, [f"{n}.md" for n in names] + [f"{names[-1]}__before-after.md"],
                  claim=[f"{n}.json" for n in names])
    outputs.check(args.trace_dir, [f"hunt_{n}.log" for n in names], option="--trace-dir")
    for out in paths:
        if out.exists() and not args.replace:
            raise UsageError(f"{out} already exists: pass --replace to overwrite it.")
    built = build_from_args(args, scenario)
    spec = compile_spec(args)
    apply_compile(built, spec)
    found = []
    for fx, name, out in zip(arms, names, paths):
        if args.baseline:
            progress(f"--- hunt {'with ' + ', '.join(f.name for f in fx) if fx else 'without fixes'}")
        log = Path(args.trace_dir) / f"hunt_{name}.log"
        compiler: dict = {}
        with applied(fx, built.pipe), quietly(log):
            if spec.mode == "compile":
                progress("warm-up call (compiling) ...")
                with compiler_notes(compiler):
                    timed_call(built, seed=args.seed, marks=False)
            outcome = hunt.hunt(built, Path(args.trace_dir), f"hunt_{name}", args.seed, progress)
        say_where_output_went(log)
        result = msgspec.convert({
            "name": name, "created": results.now(), "command": command_line(), "scenario": scenario.name,
            "size": built.size, "layers": built.layers, "build": built.build, "settings": built.settings,
            "steps": built.steps,
            "mode": spec.describe(), "fixes": [f.name for f in fx], "environment": results.environment(built.device, copy_rates.rates(built.device)),
            "compiler": compiler or None, **outcome}, HuntResult)
        save_report(out, result, hunt.markdown(result))
        found.append(result)
    if args.baseline:
        text = hunt.comparison(*found, files=[p.name for p in paths])
        path = paths[-1].with_name(paths[-1].stem + "__before-after.md")
        files.write_text(path, text)
        print(text)
        print(f"wrote {path}")
    return 0

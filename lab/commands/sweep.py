"""`lab sweep`: the A/B at each value of one varied setting, and where the fix matters."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from lab.base import files, naming, outputs
from lab.base.errors import UsageError
from lab.commands._options import ab_options, compile_options, scenario_options
from lab.commands._shared import (
    ab_config,
    build_from_args,
    command_line,
    compile_spec,
    device_tag,
    fixes_for,
    progress,
    quietly,
    say_where_output_went,
    settings_of,
    size_tag,
)
from lab.run import copy_rates

HELP = "run the A/B at each value of a varied setting and plot where the fix matters"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fix", required=True, help="NAME[,NAME..] or all")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--vary", required=True, metavar="KEY=V1,V2,..",
                   help="height, width, size (height and width), frames, batch, steps, or compile "
                        "(eager,default,reduce-overhead,max-autotune)")
    ab_options(p)
    p.add_argument("--out", default="results/sweep", help="results directory (default results/sweep)")
    p.add_argument("--name")


def run(args: argparse.Namespace) -> int:
    import msgspec

    from lab import results
    from lab.measure import sweep
    from lab.measure.cell import aside
    from lab.pages import sweep_report
    from lab.results.schema import SweepResult
    from lab.run.scenario import BUILD, default_device, default_size, get_scenario

    scenario = get_scenario(args.pipeline)
    outputs.check_name(args.name)
    fixes, notes = fixes_for(scenario, args.fix, required=True, settings=settings_of(args))
    key, values = sweep.parse_vary(args.vary)
    device = args.device or default_device()
    size = size_tag(args, device)
    varies_mode = key == "compile"  # then --mode is meaningless: neither the name nor the header claims one
    name = args.name or naming.sweep_name([f.name for f in fixes], key, args.mode, size, device_tag(device))
    out = Path(args.out) / scenario.name / f"{name}.json"
    # where the sweep and its traces go, before anything is built; the sweep is this run's until it ends
    outputs.check(args.out, [Path(scenario.name) / f"{name}{end}" for end in (".md", ".png")],
                  claim=[Path(scenario.name) / f"{name}.json"])
    outputs.check(args.trace_dir, [f"{scenario.name}_{name}.log"], option="--trace-dir")
    if out.exists() and not args.replace:
        raise UsageError(f"{out} already exists: pass --replace to overwrite it, or --name to write another.")
    config = ab_config(args)
    built_sizes = []

    def build_point():
        built = build_from_args(args, scenario)
        built_sizes.append((built.size, built.device))
        return built

    log = Path(args.trace_dir) / f"{scenario.name}_{name}.log"
    replacing = out.exists()  # `--replace`: this run's traces stay apart until it completes
    traces = aside(Path(args.trace_dir) / scenario.name / name, args.trace_dir) if replacing else Path(args.trace_dir)
    with quietly(log):
        points = sweep.sweep(build_point, fixes, key, values, compile_spec(args), config, traces,
                             f"{scenario.name}_{name}", progress)
    say_where_output_went(log)
    size, device = built_sizes[0] if built_sizes else (args.size or default_size(device), device)
    result = msgspec.convert({
        "name": name, "created": results.now(), "command": command_line(), "scenario": scenario.name, "size": size,
        "layers": args.layers, "fixes": [f.name for f in fixes], "key": key, "values": values,
        "config": dataclasses.asdict(config),
        "base_mode": sweep_report.per_point_mode(args.compile_regional) if varies_mode else compile_spec(args).describe(),
        "environment": results.environment(device, copy_rates.rates(device)), "points": points, "notes": notes,
        "build": "pretrained" if size == "pretrained" else BUILD, "settings": settings_of(args)}, SweepResult)
    interrupted = len(result.points) < len(values) or any(p.interrupted for p in result.points)
    if interrupted and replacing:  # the kept sweep keeps its result and its traces
        kept, out = out, aside(out, args.trace_dir)
        progress(f"interrupted: {kept} is kept with its traces; this run's {len(result.points)} point(s) are in {out}, "
                 f"its traces in {traces}")
    elif replacing:
        for trace in sorted(traces.glob("*")):
            trace.replace(Path(args.trace_dir) / trace.name)
        traces.rmdir()
    results.write(out, result, replace=True)
    png = sweep_report.plot(result, out.with_suffix(".png"))
    md = sweep_report.markdown(result, png.name if png else None)
    files.write_text(out.with_suffix(".md"), md)
    print(md)
    print(f"wrote {out}, {out.with_suffix('.md').name}" + (f", {png.name}" if png else ""))
    if interrupted:  # a Ctrl-C or a time limit: what it completed is kept, and the command says so and exits 130
        done = [str(p.value) for p in result.points if not p.interrupted]
        cut = [str(p.value) for p in result.points if p.interrupted]
        left = [str(v) for v in values[len(result.points):]]
        progress(f"interrupted: kept in {out} the point(s) {key} = {', '.join(done) or 'none'}"
                 + (f", and the complete blocks of {key} = {', '.join(cut)}" if cut else "")
                 + (f"; not measured: {key} = {', '.join(left)}" if left else ""))
        return 130
    return 0

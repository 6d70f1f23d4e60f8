"""The subcommand handlers: parse options into calls of the library modules and print what they return."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from tabulate import tabulate

from lab.errors import LabError, UsageError, describe_failure


def command_line() -> str:
    """The command as the user would type it (`lab ...`), for the result files."""
    return "lab " + shlex.join(sys.argv[1:])


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- fixes and diffs --------------------------------------------------------------------------------------------


def cmd_fixes(args: argparse.Namespace) -> int:
    from lab.fix import catalog
    from lab.versions import diffusers_version

    rows = []
    for fix in catalog().values():
        upstream = ", ".join(fix.upstream.refs) + (f" (in {fix.upstream.since})" if fix.upstream.since else " (not upstream)")
        rows.append({
            "fix": fix.name, "kind": fix.kind, "description": fix.description, "targets": list(fix.targets),
            "pipelines": list(fix.pipelines), "upstream": upstream,
            "status": fix.summary_status(),
            "sites": [{"module": st.rewrite.module, "state": st.state, "detail": st.detail} for st in fix.site_statuses()],
        })
    if args.json:
        print(json.dumps({"diffusers": str(diffusers_version()), "fixes": rows}, indent=2))
        return 0
    print(f"Fixes on the installed diffusers {diffusers_version()}:\n")
    def short(target: str) -> str:  # diffusers.pipelines.wan.pipeline_wan:WanPipeline.__call__ -> pipeline_wan:WanPipeline.__call__
        module, _, name = target.partition(":")
        return f"{module.rsplit('.', 1)[-1]}:{name}" if name else target

    table = [[r["fix"], r["kind"], "\n".join(short(t) for t in r["targets"]),
              "every scenario" if r["pipelines"] == ["*"] else ", ".join(r["pipelines"]), r["upstream"],
              r["status"]] for r in rows]
    print(tabulate(table, headers=["fix", "kind", "targets", "pipelines", "upstream", "status here"], tablefmt="simple_grid",
                   maxcolwidths=[None, None, 60, 22, 28, 50]))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from lab.diff import fix_diff
    from lab.fix import catalog, get_fix

    fixes = [f for f in catalog().values() if f.rewrites] if args.all else [get_fix(args.fix)]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for fix in fixes:
            try:
                text = fix_diff(fix)
            except UsageError as e:
                _progress(f"skipped {fix.name}: {e}")
                continue
            (out / f"{fix.name}.diff").write_text(text)
            _progress(f"wrote {out / (fix.name + '.diff')}")
        return 0
    for fix in fixes:
        try:
            sys.stdout.write(fix_diff(fix))
        except UsageError as e:
            if not args.all:
                raise
            _progress(f"skipped {fix.name}: {e}")
    return 0


# --- scenarios and runs ------------------------------------------------------------------------------------------


def cmd_scenarios(args: argparse.Namespace) -> int:
    import torch

    from lab.scenario import catalog, default_device, default_size, estimate, fmt_bytes, fmt_params

    device = default_device()
    rows = []
    for s in catalog().values():
        full = estimate(s, "full", None, torch.bfloat16)
        tiny = estimate(s, "tiny", None, torch.float32)
        call = {k: v for k, v in s.call.items()}
        rows.append({
            "name": s.name, "pipeline": s.pipeline_cls.rsplit(".", 1)[-1], "checkpoint": s.checkpoint,
            "sizes": "full, tiny, pretrained, full --layers N",
            "params_full": full.total_params, "peak_full_bytes_estimate": full.peak_bytes,
            "params_tiny": tiny.total_params, "call": call, "sources": s.sources,
        })
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(f"Default here: --size {default_size(device)} on {device}.\n")
    table = [
        [r["name"], r["pipeline"], r["checkpoint"], fmt_params(r["params_full"]), fmt_bytes(r["peak_full_bytes_estimate"]),
         fmt_params(r["params_tiny"]), ", ".join(f"{k}={v}" for k, v in r["call"].items())]
        for r in rows
    ]
    print(tabulate(table, headers=["scenario", "pipeline", "checkpoint", "params (full)", "peak mem est. (full, bf16)",
                                   "params (tiny)", "call settings"], tablefmt="simple", maxcolwidths=[None, None, 30, None, None, None, 40]))
    print("\nAll scenarios: output_type='latent' (--full-decode to decode), 4 steps (--steps), random weights from "
          "the true configs (--size pretrained loads the checkpoint). Peak memory is an estimate (weights + activations).")
    return 0


def save_report(path: Path, result: dict, markdown: str, extra: list[Path] = ()) -> None:
    """Write a result JSON (versioned, `results.write`) and its markdown beside it; print the markdown."""
    from lab import results

    results.write(path, result, replace=True)
    path.with_suffix(".md").write_text(markdown)
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in [path, path.with_suffix(".md"), *extra]))


def fixes_for(scenario, spec: str, *, required: bool = False) -> tuple[list, list[str]]:
    """The fixes named by `--fix` that apply to the scenario, and a note for each one skipped (`all`, upstream)."""
    from lab.fix import check_fixes_for, parse_fix_list

    if not spec and not required:
        return [], []
    fixes, notes = check_fixes_for(scenario.name, parse_fix_list(spec), skip_inapplicable=spec == "all")
    for note in notes:
        _progress(note)
    if required and not fixes:
        raise UsageError(f"No fix applies to `{scenario.name}` on this diffusers; nothing to compare.")
    return fixes, notes


def build_from_args(args: argparse.Namespace, scenario=None):
    from lab.scenario import DTYPES, build, default_device, default_size, fmt_params, get_scenario

    scenario = scenario or get_scenario(args.pipeline)
    device = args.device or default_device()
    size = args.size or default_size(device)
    _progress(f"building {scenario.name} at size `{size}` on {device}"
              + ("" if args.size else " (default for this machine)")
              + (f", {args.layers} transformer blocks" if args.layers else "") + " ...")
    built = build(scenario, size=size, device=device, dtype=DTYPES[args.dtype] if args.dtype else None,
                  layers=args.layers, steps=args.steps, full_decode=args.full_decode,
                  checkpoint=args.checkpoint, seed=args.seed, call=args.call)
    _progress(f"built {scenario.pipeline_cls.rsplit('.', 1)[-1]}: {fmt_params(built.params)} parameters, {built.dtype}"
              + "".join(f"; {n}" for n in built.notes))
    return built


def compile_spec(args: argparse.Namespace):
    from lab.runner import CompileSpec

    return CompileSpec(mode=args.mode, regional=args.compile_regional, fullgraph=args.compile_fullgraph,
                       compile_mode=args.compile_mode)


def prepared(args: argparse.Namespace):
    """The scenario, the applicable fixes, the built pipeline (compiled as asked) and the compile spec."""
    from lab.runner import apply_compile
    from lab.scenario import get_scenario

    scenario = get_scenario(args.pipeline)
    fixes, _ = fixes_for(scenario, args.fix)
    built = build_from_args(args, scenario)
    spec = compile_spec(args)
    apply_compile(built, spec)
    return scenario, fixes, built, spec


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    from lab.fix import applied, exercised
    from lab.patching import CallCounter
    from lab.runner import check_finite, timed_call

    scenario, fixes, built, spec = prepared(args)
    counter = CallCounter()
    with applied(fixes, built.pipe, counter):
        for i in range(args.warmup + (1 if spec.mode == "compile" and args.warmup == 0 else 0)):
            _progress(f"warm-up call {i + 1}{' (compiling)' if spec.mode == 'compile' and i == 0 else ''} ...")
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
            "scenario": scenario.name, "size": built.size, "steps": built.steps, "mode": spec.describe(),
            "device": built.device, "wall_ms": result.wall_ms, "steps_ms": result.steps_ms,
            "stages_ms": result.stages_ms, "output_shape": list(result.output.shape), "peak_gpu_bytes": peak,
            "params": built.params, "fixes": [f.name for f in fixes], "warmup": args.warmup,
            "gpu": torch.cuda.get_device_name() if built.device.startswith("cuda") else None,
            "finite": bad is None, "command": command_line(),
        }
        Path(args.json).write_text(json.dumps(report, indent=2))
        _progress(f"wrote {args.json}")
    return 0


# --- profile and analyze ------------------------------------------------------------------------------------------


def cmd_profile(args: argparse.Namespace) -> int:
    from lab.analysis import analyze
    from lab.analysis_report import format_analysis
    from lab.fix import applied
    from lab.profile import ProfileOptions, profile_call, timing_report, write_json
    from lab.runner import apply_compile, timed_call
    from lab.scenario import get_scenario
    from lab.trace import load

    scenario = get_scenario(args.pipeline)
    fixes, _ = fixes_for(scenario, args.fix)
    options = ProfileOptions(
        record_shapes=args.record_shapes, with_stack=args.with_stack, profile_memory=args.profile_memory,
        memory_snapshot=args.memory_snapshot, with_flops=args.with_flops,
        op_tables=tuple(t for t in (args.op_tables or "").split(",") if t), op_table_format=args.op_table_format,
        folded_stacks=args.folded_stacks, skip_steps=args.skip_steps, capture_steps=args.capture_steps,
    )
    options.validate(args.steps)
    built = build_from_args(args, scenario)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = ["eager", "compile"] if args.mode == "both" else [args.mode]
    for mode in modes:
        args_mode = argparse.Namespace(**{**vars(args), "mode": mode})
        spec = compile_spec(args_mode)
        apply_compile(built, spec)
        stem = f"{scenario.name}_{mode}" + (f"_{'+'.join(f.name for f in fixes)}" if fixes else "")
        with applied(fixes, built.pipe):
            _progress(f"[{mode}] warm-up call (unprofiled{', compiling' if mode == 'compile' else ''}) ...")
            timed_call(built, seed=args.seed, marks=False)
            _progress(f"[{mode}] timed call ({'CUDA events' if built.device.startswith('cuda') else 'host timestamps'} "
                      "at step boundaries, no profiler) ...")
            report = timing_report(built, spec, seed=args.seed)
            write_json(out / f"{stem}_timing.json", report)
            _progress(f"[{mode}] profiled call ...")
            paths = profile_call(built, out, stem, options, seed=args.seed)
        print(f"\n== {scenario.name} [{spec.describe()}]: {report['wall_ms']:.1f} ms per call; steps (ms): "
              + ", ".join(f"{x:.1f}" for x in report["steps_ms"]))
        for kind, path in paths.items():
            print(f"  {kind}: {path}")
        print(f"  timing: {out / (stem + '_timing.json')}")
        print()
        print("\n".join(format_analysis(analyze(load(paths["trace"])), top=5)))
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from lab.analysis import analyze, compare
    from lab.analysis_report import format_analysis, format_compare
    from lab.trace import load

    if len(args.traces) > 2:
        raise UsageError("Give one trace to analyze, or two (CONTROL TEST) to compare.")
    functions = tuple(args.function or ())
    traces = [load(t) for t in args.traces]
    if len(traces) == 1:
        result = analyze(traces[0], functions=functions, gap_threshold_us=args.gap_threshold)
        lines = format_analysis(result)
    else:
        result = compare(*traces, functions=functions, gap_threshold_us=args.gap_threshold)
        lines = format_compare(result)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0


# --- A/B --------------------------------------------------------------------------------------------------------------


def size_tag(args: argparse.Namespace, device: str) -> str:
    """The size part of a result name: `full`, `tiny`, or `full-4l` with `--layers 4`."""
    from lab.scenario import default_size

    return f"{args.size or default_size(device)}{f'-{args.layers}l' if args.layers else ''}"


def _device_tag(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "a100", "l40s", "b200"):
        if tag in name:
            return tag
    return "gpu"


def result_paths(out: Path, pipeline: str, name: str) -> dict[str, Path]:
    base = out / pipeline / name
    return {"json": base.with_suffix(".json"), "md": base.with_suffix(".md"), "png": base.with_suffix(".png")}


def write_ab_result(result: dict, paths: dict[str, Path], replace: bool) -> None:
    from lab import report, results

    results.write(paths["json"], result, replace=replace)
    png = report.plot(result, paths["png"])
    paths["md"].write_text(report.markdown(result, png.name if png else None))


def fix_sets(scenario, spec: str) -> list[tuple[list, list[str]]]:
    """The fix sets one `lab ab` compares, each with its notes: the named fixes together, or `each` (`lab.fix.each_sets`)."""
    from lab.fix import each_sets

    if spec != "each":
        return [fixes_for(scenario, spec, required=True)]
    sets = each_sets(scenario.name)
    if not sets:
        raise UsageError(f"No fix applies to `{scenario.name}` on this diffusers; nothing to compare.")
    for note in sets[-1][1]:
        _progress(note)
    return sets


def check_ab_counts(args: argparse.Namespace) -> None:
    for option in ("blocks", "repeat", "profile_calls"):
        if getattr(args, option) < 1:
            raise UsageError(f"`--{option.replace('_', '-')}` must be at least 1.")
    if args.warmup < 0:
        raise UsageError("`--warmup` cannot be negative.")


def cmd_ab(args: argparse.Namespace) -> int:
    from lab import ab
    from lab.runner import apply_compile
    from lab.scenario import default_device, default_size, get_scenario

    scenario = get_scenario(args.pipeline)
    sets = [([], [])] if args.control == "aa" else fix_sets(scenario, args.fix)
    each = len(sets) > 1 or args.fix == "each"
    check_ab_counts(args)
    if each and args.name:
        raise UsageError("`--name` names one result; with `--fix each` every fix set gets its own default name.")
    if each and args.isolate:
        raise UsageError("`--isolate` builds the pipeline once per arm and run; run one fix set per command with it.")
    config = ab.ABConfig(blocks=args.blocks, warmup=args.warmup, repeat=args.repeat, alpha=args.alpha, margin=args.margin / 100,
                         seed=args.seed, profile=args.profile, with_stack=args.with_stack,
                         profile_calls=args.profile_calls)
    spec = compile_spec(args)
    device = args.device or default_device()
    size = args.size or default_size(device)
    planned = []
    for fixes, notes in sets:
        tag = "+".join(f.name for f in fixes) if fixes else "aa"
        name = args.name or f"{tag}__{args.mode}__{size_tag(args, device)}__{_device_tag(device)}"
        paths = result_paths(Path(args.out), scenario.name, name)
        if paths["json"].exists() and not args.replace:
            if not each:
                raise UsageError(f"{paths['json']} already exists: pass --replace to overwrite it, or --name to write another.")
            _progress(f"kept {paths['json']} (it exists; --replace runs it again)")
            continue
        planned.append((fixes, notes, tag, name, paths))
    if not planned:
        return 0
    if args.isolate:
        from lab.worker import IsolatedArm

        _progress(f"starting one worker process per arm (each builds {scenario.name} at size `{size}` on {device}) ...")
        b = {"scenario": scenario.name, "size": size, "device": device, "dtype": args.dtype, "layers": args.layers,
             "steps": args.steps, "full_decode": args.full_decode, "checkpoint": args.checkpoint, "seed": args.seed,
             "call": args.call}
        built = None
        info = {"size": size, "layers": args.layers, "steps": args.steps, "device": device}
    else:
        built = build_from_args(args, scenario)
        apply_compile(built, spec)
        info = {"size": built.size, "layers": built.layers, "steps": built.steps, "device": built.device}

    def arms(fixes: list) -> tuple:
        if args.isolate:
            return IsolatedArm("control", [], b, dataclasses.asdict(spec)), IsolatedArm("test", fixes, b, dataclasses.asdict(spec))
        return ab.Arm("control", []), ab.Arm("test", fixes)

    failed = 0
    for i, (fixes, notes, tag, name, paths) in enumerate(planned):
        if each:
            _progress(f"\n[{i + 1}/{len(planned)}] {scenario.name}: A/B of {tag}")
        try:
            result = _ab_one(args, scenario, built, spec, arms(fixes), config, fixes, notes, name, info)
        except (LabError, KeyboardInterrupt):
            raise
        except Exception as e:  # with `each`, one fix set failing keeps the others' results
            if not each:
                raise
            print(f"ERROR: {tag}: {describe_failure(e)}", file=sys.stderr)
            failed += 1
            continue
        write_ab_result(result, paths, replace=True)
        _print_ab(result, scenario.name, tag, paths)
        failed += result["verdict"] == "outputs differ"
    return 1 if failed else 0


def _ab_one(args, scenario, built, spec, arms, config, fixes, notes, name, info) -> dict:
    """One A/B run of one fix set over the shared build, as the result dict that `write_ab_result` stores."""
    from lab import ab, results

    control, test = arms
    try:
        outcome = ab.run(built, spec, control, test, config, Path(args.trace_dir), f"{scenario.name}_{name}", _progress)
    finally:
        for arm in (control, test):
            if hasattr(arm, "close"):
                arm.close()
    return {
        "format": results.FORMAT_VERSION, "kind": "ab", "name": name, "created": results.now(),
        "command": command_line(),
        "scenario": scenario.name, "pipeline": scenario.pipeline_cls, "size": info["size"], "layers": info["layers"],
        "steps": info["steps"], "mode": spec.describe(), "compile": dataclasses.asdict(spec), "isolated": args.isolate,
        "fixes": [f.name for f in fixes], "control": args.control, "notes": notes,
        "config": dataclasses.asdict(config), "environment": results.environment(info["device"]),
        **outcome,
    }


def _print_ab(result: dict, scenario: str, tag: str, paths: dict[str, Path]) -> None:
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


def cmd_sweep(args: argparse.Namespace) -> int:
    from lab import ab, results, sweep
    from lab.scenario import get_scenario

    scenario = get_scenario(args.pipeline)
    fixes, notes = fixes_for(scenario, args.fix, required=True)
    key, values = sweep.parse_vary(args.vary)
    check_ab_counts(args)
    tag = "+".join(f.name for f in fixes)
    probe = argparse.Namespace(**vars(args))
    from lab.scenario import default_device, default_size

    device = args.device or default_device()
    size = size_tag(args, device)
    # varying the compile mode makes --mode meaningless: neither the name nor the header should claim one
    varies_mode = key == "compile"
    name = args.name or f"{tag}__{key}{'' if varies_mode else f'__{args.mode}'}__{size}__{_device_tag(device)}"
    out = Path(args.out) / scenario.name / f"{name}.json"
    if out.exists() and not args.replace:
        raise UsageError(f"{out} already exists: pass --replace to overwrite it, or --name to write another.")
    config = ab.ABConfig(blocks=args.blocks, warmup=args.warmup, repeat=args.repeat, alpha=args.alpha,
                         margin=args.margin / 100, seed=args.seed, profile=args.profile, with_stack=args.with_stack,
                         profile_calls=args.profile_calls)
    built_sizes = []

    def build_point():
        built = build_from_args(probe, scenario)
        built_sizes.append((built.size, built.device))
        return built

    points = sweep.sweep(build_point, fixes, key, values, compile_spec(args), config, Path(args.trace_dir),
                         f"{scenario.name}_{name}", _progress)
    size, device = built_sizes[0] if built_sizes else (args.size or default_size(device), device)
    result = {"format": results.FORMAT_VERSION, "kind": "sweep", "name": name, "created": results.now(),
              "command": command_line(), "scenario": scenario.name, "size": size, "layers": args.layers,
              "fixes": [f.name for f in fixes],
              "key": key, "values": values, "config": dataclasses.asdict(config),
              "base_mode": sweep.per_point_mode(args.compile_regional) if varies_mode else compile_spec(args).describe(),
              "environment": results.environment(device), "points": points, "notes": notes}
    results.write(out, result, replace=True)
    png = sweep.plot(result, out.with_suffix(".png"))
    md = sweep.markdown(result, png.name if png else None)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out}, {out.with_suffix('.md').name}" + (f", {png.name}" if png else ""))
    return 0


def _ab_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blocks", type=int, default=12,
                   help="interleaved blocks (each runs both arms); default 12, enough to survive one disturbed block")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per arm after each switch (default 1)")
    p.add_argument("--repeat", type=int, default=3,
                   help="timed calls per arm per block, alternating C T T C; the block's value is their median (default 3)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--margin", type=float, default=1.0, help="equivalence margin in percent (default ±1%%)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True, help="paired profiled calls")
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--profile-calls", type=int, default=3,
                   help="profiled calls per arm; the trace metrics are their medians, with their range (default 3)")
    p.add_argument("--replace", action="store_true", help="overwrite an existing result")
    p.add_argument("--trace-dir", default="traces", help="where the paired traces go (default traces/, not in git)")


def cmd_scan(args: argparse.Namespace) -> int:
    from lab import scan
    from lab.scenario import get_scenario, resolve

    if args.pipeline:
        scenario = get_scenario(args.pipeline)
        classes = [scenario.pipeline_cls, scenario.scheduler[0]] + [m.cls for m in scenario.models.values()]
        modules = {resolve(c).__module__ for c in classes} | {"diffusers.hooks.hooks", "diffusers.models.cache_utils"}
        paths = scan.module_files(sorted(modules))
    else:
        paths = [Path(p) for p in args.paths] or [scan.diffusers_root() / "diffusers"]
    findings = scan.scan(paths, progress=_progress)
    if args.pattern:
        findings = [f for f in findings if f.pattern in args.pattern]
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=1))
        return 0
    rows = [[f.where, f.function, f.pattern, f.code] for f in findings]
    print(tabulate(rows, headers=["file:line", "function", "pattern", "code"], maxcolwidths=[60, 40, 18, 60]))
    counts = {}
    for f in findings:
        counts[f.pattern] = counts.get(f.pattern, 0) + 1
    print(f"\n{len(findings)} candidates: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def cmd_hunt(args: argparse.Namespace) -> int:
    from lab import hunt, results
    from lab.fix import applied
    from lab.runner import timed_call

    if args.baseline and not args.fix:
        raise UsageError("--baseline compares a hunt without the fixes to one with them: name the fixes with --fix.")
    scenario, fixes, built, spec = prepared(args)
    if args.baseline and not fixes:
        raise UsageError(f"--baseline: none of `{args.fix}` applies to `{scenario.name}`, so there is nothing to compare.")
    arms = ([[]] if args.baseline else []) + [fixes]

    def name_of(fx: list) -> str:
        tag = ("+".join(f.name for f in fx) + "__") if fx else ""
        return args.name or f"{scenario.name}__{tag}{args.mode}__{size_tag(args, built.device)}__{_device_tag(built.device)}"

    names = [name_of(fx) + ("__before" if args.baseline and args.name and not fx else "") for fx in arms]
    paths = [Path(args.out) / f"{n}.json" for n in names]
    for out in paths:
        if out.exists() and not args.replace:
            raise UsageError(f"{out} already exists: pass --replace to overwrite it.")
    found = []
    for fx, name, out in zip(arms, names, paths):
        if args.baseline:
            _progress(f"--- hunt {'with ' + ', '.join(f.name for f in fx) if fx else 'without fixes'}")
        with applied(fx, built.pipe):
            if spec.mode == "compile":
                _progress("warm-up call (compiling) ...")
                timed_call(built, seed=args.seed, marks=False)
            outcome = hunt.hunt(built, Path(args.trace_dir), f"hunt_{name}", args.seed, _progress)
        result = {"format": results.FORMAT_VERSION, "kind": "hunt", "name": name, "created": results.now(),
                  "command": command_line(), "scenario": scenario.name, "size": built.size, "layers": built.layers,
                  "steps": built.steps, "mode": spec.describe(), "fixes": [f.name for f in fx],
                  "environment": results.environment(built.device), **outcome}
        save_report(out, result, hunt.markdown(result))
        found.append(result)
    if args.baseline:
        text = hunt.comparison(*found, files=[p.name for p in paths])
        path = paths[-1].with_name(paths[-1].stem + "__before-after.md")
        path.write_text(text)
        print(text)
        print(f"wrote {path}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from lab import calibrate, results
    from lab.runner import apply_compile
    from lab.scenario import default_device, get_scenario

    scenario = get_scenario(args.pipeline)
    device = args.device or default_device()
    size = size_tag(args, device)
    name = args.name or f"{scenario.name}__{args.mode}__{size}__{_device_tag(device)}"
    path = Path(args.out) / f"{name}.json"
    if path.exists() and not args.replace:  # before the build, which can take minutes
        raise UsageError(f"{path} already exists: pass --replace to overwrite it.")
    built = build_from_args(args, scenario)
    spec = compile_spec(args)
    apply_compile(built, spec)
    config = calibrate.CalibrationConfig(trials=args.trials, blocks=args.blocks, warmup=args.warmup, repeat=args.repeat,
                                         alpha=args.alpha, stall_ms=args.stall_ms, seed=args.seed)
    outcome = calibrate.calibrate(built, config, _progress)
    result = {"format": results.FORMAT_VERSION, "kind": "calibration", "name": name, "created": results.now(),
              "command": command_line(), "scenario": scenario.name, "size": built.size, "layers": built.layers,
              "steps": built.steps, "mode": spec.describe(), "config": dataclasses.asdict(config),
              "environment": results.environment(built.device), **outcome}
    save_report(path, result, calibrate.markdown(result))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from lab import table

    path = table.write(Path(args.results), allow_mixed=args.allow_mixed)
    print(f"wrote {path}")
    return 0


def add_more_parsers(sub, scenario_options, compile_options) -> None:
    p = sub.add_parser("profile", help="warm up, time (per-step CUDA events) and profile one call of a scenario")
    scenario_options(p)
    compile_options(p, ("eager", "compile", "both"))
    p.add_argument("--fix", default="", help="fixes to apply: NAME[,NAME..] or all")
    p.add_argument("--out", default="traces", help="output directory (default: traces/)")
    p.add_argument("--record-shapes", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=True,
                   help="Python stacks (needed for sync call sites; makes traces large)")
    p.add_argument("--profile-memory", action="store_true", help="allocator events (memory per step)")
    p.add_argument("--memory-snapshot", action="store_true", help="CUDA memory snapshot pickle (pytorch.org/memory_viz)")
    p.add_argument("--with-flops", action="store_true")
    p.add_argument("--op-tables", help="comma list of summary,shape,stack: op tables written beside the trace")
    p.add_argument("--op-table-format", choices=("md", "csv"), default="md")
    p.add_argument("--folded-stacks", action="store_true", help="folded stacks for flame graphs")
    p.add_argument("--skip-steps", type=int, default=0, help="capture from denoising step K on")
    p.add_argument("--capture-steps", type=int, help="capture N denoising steps only (smaller traces)")

    p = sub.add_parser("analyze", help="analyze a torch.profiler trace, or compare two (CONTROL TEST)")
    p.add_argument("traces", nargs="+", metavar="TRACE", help=".json or .json.gz Chrome trace(s)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.add_argument("--function", action="append", metavar="FILE:FUNC",
                   help="also total a Python function, e.g. hooks.py:_set_context (repeatable)")
    p.add_argument("--gap-threshold", type=float, default=100.0, help="list GPU idle gaps longer than this (µs)")

    p = sub.add_parser("ab", help="A/B a fix: verify outputs, paired profiles, interleaved timing, significance")
    p.add_argument("--fix", default="",
                   help="NAME[,NAME..] or all (fixes that do not apply are skipped with a note), or each: every "
                        "applicable fix alone and then all together, one result each, on one build (results that "
                        "exist are kept unless --replace)")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--isolate", action="store_true",
                   help="run each arm in its own worker process (each builds the pipeline; twice the memory)")
    p.add_argument("--control", choices=("off", "aa"), default="off",
                   help="off: control runs without the fixes; aa: both arms run the same code (calibration)")
    _ab_options(p)
    p.add_argument("--out", default="results/ab", help="results directory (default results/ab)")
    p.add_argument("--name", help="result name (default: <fixes>__<mode>__<size>__<device>)")

    p = sub.add_parser("sweep", help="run the A/B at each value of a varied setting and plot where the fix matters")
    p.add_argument("--fix", required=True, help="NAME[,NAME..] or all")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--vary", required=True, metavar="KEY=V1,V2,..",
                   help="height, width, size (height and width), frames, batch, steps, or compile "
                        "(eager,default,reduce-overhead,max-autotune)")
    _ab_options(p)
    p.add_argument("--out", default="results/sweep", help="results directory (default results/sweep)")
    p.add_argument("--name")

    p = sub.add_parser("calibrate", help="A/A false-positive rate and positive-control power of `lab ab`")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--trials", type=int, default=40, help="comparisons of each kind (default 40)")
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--stall-ms", type=float, default=0.5, help="positive control: injected host stall per step (ms)")
    p.add_argument("--out", default="results/calibration")
    p.add_argument("--name")
    p.add_argument("--replace", action="store_true")

    p = sub.add_parser("table", help="regenerate results/README.md (the docs tables) from the result JSONs")
    p.add_argument("--results", default="results", help="results directory (default results/)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="allow results from different environments (GPU, torch, diffusers) in one table")

    p = sub.add_parser("scan", help="static scan of diffusers source for sync-prone patterns (file:line)")
    p.add_argument("paths", nargs="*", help="files or directories (default: the installed diffusers)")
    p.add_argument("--pipeline", help="scan the modules a scenario runs through instead")
    p.add_argument("--pattern", action="append", help="only these patterns (repeatable)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("hunt", help="find every host-device sync of a pipeline call (profiler + sync debug mode + scan)")
    scenario_options(p)
    compile_options(p)
    p.add_argument("--fix", default="", help="hunt with these fixes applied (NAME[,NAME..] or all)")
    p.add_argument("--baseline", action="store_true",
                   help="first hunt without the fixes (same build) and write a before/after comparison")
    p.add_argument("--out", default="results/hunt")
    p.add_argument("--name")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--trace-dir", default="traces")

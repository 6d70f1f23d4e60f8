"""`lab profile`: one warm-up call, one timed call (stage and per-step report), one profiled call."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.commands._options import compile_options, scenario_options
from lab.commands._shared import build_from_args, compile_spec, fixes_for, progress, quietly, say_where_output_went

HELP = "warm up, time (per-step CUDA events) and profile one call of a scenario"


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
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
        spec = compile_spec(argparse.Namespace(**{**vars(args), "mode": mode}))
        apply_compile(built, spec)
        stem = f"{scenario.name}_{mode}" + (f"_{'+'.join(f.name for f in fixes)}" if fixes else "")
        log = out / f"{stem}.log"
        with applied(fixes, built.pipe), quietly(log):
            progress(f"[{mode}] warm-up call (unprofiled{', compiling' if mode == 'compile' else ''}) ...")
            timed_call(built, seed=args.seed, marks=False)
            progress(f"[{mode}] timed call ({'CUDA events' if built.device.startswith('cuda') else 'host timestamps'} "
                     "at step boundaries, no profiler) ...")
            report = timing_report(built, spec, seed=args.seed)
            write_json(out / f"{stem}_timing.json", report)
            progress(f"[{mode}] profiled call ...")
            paths = profile_call(built, out, stem, options, seed=args.seed)
        say_where_output_went(log)
        print(f"\n== {scenario.name} [{spec.describe()}]: {report['wall_ms']:.1f} ms per call; steps (ms): "
              + ", ".join(f"{x:.1f}" for x in report["steps_ms"]))
        for kind, path in paths.items():
            print(f"  {kind}: {path}")
        print(f"  timing: {out / (stem + '_timing.json')}")
        print()
        print("\n".join(format_analysis(analyze(load(paths["trace"])), top=5)))
    return 0

"""`lab profile`: one warm-up call, one timed call (stage and per-step report), one profiled call."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.base import files, outputs
from lab.commands._options import compile_options, scenario_options
from lab.commands._shared import (
    build_from_args,
    compile_spec,
    compiler_log,
    fixes_for,
    progress,
    quietly,
    say_where_output_went,
    settings_of,
)
from lab.run import copy_rates

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
    p.add_argument("--report", metavar="DIR",
                   help="also write the analysis as a result: DIR/<pipeline>_<mode>[_fixes]__<size>__<device>.{md,json}")


def compile_log_lines(phases: dict) -> list[str]:
    """The compiler's account of the run: its first call, and anything compiled after it."""
    first, later = phases["first call"], phases["later calls"]
    lines = ["", f"Compiler (structured log): the first call compiled {first['compilations']} frame(s) in "
                 f"{first['compile_s']:.1f} s with {first['guards']} guards; {first['graph_breaks']} graph break(s), "
                 f"{first['recompiles']} recompile(s); later calls compiled {later['compilations']}."]
    for site in first["graph_break_sites"] + later["graph_break_sites"]:
        lines.append(f"  graph break at {site['where']}: {site['reason']} (x{site['count']})")
    for r in (first["recompile_reasons"] + later["recompile_reasons"])[:5]:
        lines.append(f"  recompile of frame {r['frame']}: {r['guard']}")
    return lines


def run(args: argparse.Namespace) -> int:
    from lab.run.profile import ProfileOptions
    from lab.run.scenario import get_scenario

    scenario = get_scenario(args.pipeline)
    fixes, _ = fixes_for(scenario, args.fix, settings=settings_of(args))
    options = ProfileOptions(
        record_shapes=args.record_shapes, with_stack=args.with_stack, profile_memory=args.profile_memory,
        memory_snapshot=args.memory_snapshot, with_flops=args.with_flops,
        op_tables=tuple(t for t in (args.op_tables or "").split(",") if t), op_table_format=args.op_table_format,
        folded_stacks=args.folded_stacks, skip_steps=args.skip_steps, capture_steps=args.capture_steps,
    )
    options.validate(args.steps)
    out = Path(args.out)
    modes = ["eager", "compile"] if args.mode == "both" else [args.mode]

    def stem_of(mode: str) -> str:
        tag = "compile-whole" if mode == "compile" and not args.compile_regional else mode  # regional is `compile`
        return f"{scenario.name}_{tag}" + (f"_{'+'.join(f.name for f in fixes)}" if fixes else "")

    # where the traces and the report go, before anything is built
    outputs.check(out, [f"{stem_of(m)}{end}" for m in modes for end in (".json.gz", "_timing.json", ".log")])
    if args.report:
        outputs.check(args.report, option="--report")
    built = build_from_args(args, scenario)
    out.mkdir(parents=True, exist_ok=True)
    done: list[tuple[str, str, str]] = []  # (mode, what, where) of each file this run wrote, for an interruption
    try:
        for mode in modes:
            _profile_mode(args, scenario, fixes, built, mode, stem_of(mode), out, options, done)
    except KeyboardInterrupt:
        steps = ("timing", "trace", "report") if args.report else ("timing", "trace")
        kept = [f"[{m}] {what} {where}" for m, what, where in done]
        left = [f"[{m}] {what}" for m in modes for what in steps if not any(d[:2] == (m, what) for d in done)]
        progress(f"interrupted: kept {', '.join(kept) if kept else 'nothing (no file was complete)'}; not done: "
                 f"{', '.join(left)}")
        raise
    return 0


def _profile_mode(args, scenario, fixes, built, mode: str, stem: str, out: Path, options, done: list) -> None:
    """One mode of `lab profile`: warm-up, timed and profiled calls, the analysis and the report; each file written
    is added to `done`."""
    from lab.apply.fix import applied
    from lab.pages.analysis_report import format_analysis
    from lab.run.profile import profile_call, timing_report, write_json
    from lab.run.runner import apply_compile, timed_call
    from lab.traces.analysis import analyze
    from lab.traces.trace import load

    spec = compile_spec(argparse.Namespace(**{**vars(args), "mode": mode}))
    apply_compile(built, spec)
    log = out / f"{stem}.log"
    with applied(fixes, built.pipe), quietly(log), compiler_log(spec, out, stem) as compiled:
        progress(f"[{mode}] warm-up call (unprofiled{', compiling' if mode == 'compile' else ''}) ...")
        if compiled:
            compiled.mark("first call")
        timed_call(built, seed=args.seed, marks=False)
        if compiled:
            compiled.mark("later calls")
        progress(f"[{mode}] timed call ({'CUDA events' if built.device.startswith('cuda') else 'host timestamps'} "
                 "at step boundaries, no profiler) ...")
        report = timing_report(built, spec, seed=args.seed)
        write_json(out / f"{stem}_timing.json", report)
        done.append((mode, "timing", str(out / f"{stem}_timing.json")))
        progress(f"[{mode}] profiled call ...")
        paths = profile_call(built, out, stem, options, seed=args.seed)
        done.append((mode, "trace", str(paths["trace"])))
        phases = compiled.by_phase() if compiled else None
    say_where_output_went(log)
    print(f"\n== {scenario.name} [{spec.describe()}]: {report['wall_ms']:.1f} ms per call; steps (ms): "
          + ", ".join(f"{x:.1f}" for x in report["steps_ms"]))
    for kind, path in paths.items():
        print(f"  {kind}: {path}")
    print(f"  timing: {out / (stem + '_timing.json')}")
    print()
    analysis = analyze(load(paths["trace"]))
    text = format_analysis(analysis, top=8) + (compile_log_lines(phases) if phases else [])
    print("\n".join(text))
    if args.report:
        write_report(Path(args.report), stem, scenario, built, spec, fixes, report, analysis, phases, text)
        done.append((mode, "report", str(args.report)))


def write_report(folder: Path, stem: str, scenario, built, spec, fixes, timing: dict, analysis: dict,
                 phases: dict | None, text: list[str]) -> None:
    """`<folder>/<stem>__<size>__<device>.md` (the analysis as text) and `.json` (what it rests on: the gap
    attribution with its top folded stacks, the compile section, the checklist and the compiler's log)."""
    import msgspec

    from lab import results
    from lab.base import naming
    from lab.commands._shared import command_line, device_tag
    from lab.results.schema import OverheadReport

    name = f"{stem}__{naming.size_tag(built.size, built.layers, steps=built.steps, settings=built.setting_tags)}__{device_tag(built.device)}"
    folder.mkdir(parents=True, exist_ok=True)
    gaps = {**analysis["gaps"], "kinds": [{**k, "folded": dict(list(k["folded"].items())[:40])}
                                          for k in analysis["gaps"]["kinds"]]}
    gaps.pop("totals", None)
    data = {"format": results.FORMAT_VERSION, "kind": "overhead", "name": name, "created": results.now(),
            "command": command_line(), "scenario": scenario.name, "size": built.size, "layers": built.layers,
            "build": built.build, "settings": built.settings, "steps": built.steps, "mode": spec.describe(),
            "fixes": [f.name for f in fixes],
            "environment": results.environment(built.device, copy_rates.rates(built.device)), "wall_ms": timing["wall_ms"],
            "steps_ms": timing["steps_ms"], "cpu_gaps": analysis["cpu_gaps"], "gaps": gaps,
            "compile": analysis["compile"], "checklist": analysis["checklist"], "compiler_log": phases}
    results.write(folder / f"{name}.json", msgspec.convert(data, OverheadReport), replace=True)
    env = data["environment"]
    header = [f"# Where the host time goes: `{scenario.name}`, {spec.describe()}", "",
              f"{built.size}{f', {built.layers} transformer blocks' if built.layers else ''} · {built.steps} steps · "
              f"fixes: {', '.join(data['fixes']) or 'none'} · {env.get('gpu')} · torch {env['torch']}, diffusers "
              f"{env['diffusers']}, lab {env['lab_commit']}. One call: {timing['wall_ms']:,.1f} ms (unprofiled).", "",
              f"Command: `{data['command']}`", "", "```"]
    files.write_text(folder / f"{name}.md", "\n".join(header + text + ["```", ""]))
    progress(f"wrote {folder / (name + '.md')}, {name}.json")

"""What the subcommands share: progress on stderr, the command line for result files, building a scenario from
the options, result names, and running the same command in a process that imports another diffusers."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.base import console, files, naming, units
from lab.base.errors import UsageError

if TYPE_CHECKING:
    from lab.apply.releases import Diffusers


def command_line() -> str:
    """The command as the user would type it (`lab ...`), for the result files."""
    return "lab " + shlex.join(sys.argv[1:])


progress = console.progress


@contextlib.contextmanager
def compiler_log(spec, trace_dir: Path, stem: str):
    """The compiler's structured log (`TORCH_TRACE`) for a compiled run, in `<trace_dir>/<stem>_torch_trace/`, with
    tlparse's HTML report beside it when tlparse is installed; None for an eager run (or `spec` None: arms in
    worker processes of their own, whose compilers this process does not see)."""
    if spec is None or spec.mode != "compile":
        yield None
        return
    from lab.traces.compile_log import StructuredLog, tlparse

    log = StructuredLog(Path(trace_dir) / f"{stem}_torch_trace")
    with log:
        yield log
    html = tlparse(log.directory, Path(trace_dir) / f"{stem}_tlparse")
    progress(f"(the compiler's log: {log.directory}" + (f"; tlparse report: {html}/index.html)" if html else ")"))


def quietly(log: Path):
    """Run what follows with the pipelines' and the profiler's output in `log` (`lab.base.console.captured`)."""
    return console.captured(log)


def say_where_output_went(log: Path) -> None:
    n = console.lines_in(log)
    if n:
        progress(f"(pipeline and profiler output, {n} lines and progress-bar redraws: {log})")


def save_report(path: Path, result: Any, markdown: str, extra: list[Path] = ()) -> None:
    """Write a result JSON (versioned, `results.write`) and its markdown beside it; print the markdown."""
    from lab import results

    results.write(path, result, replace=True)
    files.write_text(path.with_suffix(".md"), markdown)
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in [path, path.with_suffix(".md"), *extra]))


def read_result(path: Path):
    """A stored result (`lab.results.read`); one that cannot be read is bad input (exit code 2), as everywhere."""
    from lab import results
    from lab.base.errors import LabError

    try:
        return results.read(path)
    except LabError as e:
        raise UsageError(str(e)) from None


def other_diffusers(spec: str) -> Diffusers:
    """The diffusers a `--diffusers SPEC` names (`lab.apply.releases.resolve`); its `site` is None when this process
    already imports it (the process `in_process_of` started)."""
    import dataclasses

    import diffusers

    from lab.apply import releases

    asked = releases.resolve(spec)
    here = Path(diffusers.__file__).resolve()
    if asked.site is not None and here.is_relative_to(Path(asked.site).resolve()):
        return dataclasses.replace(asked, site=None)
    return asked


def in_process_of(asked: Diffusers, what: str) -> int:
    """The same command in a process that imports `asked` first; its exit code. It runs in a session of its own, so
    that a Ctrl-C (or a time limit's signal) reaches it once, from here: it keeps what it measured, as it would in
    this process."""
    import os
    import signal
    import subprocess

    from lab.base.paths import child_pythonpath

    progress(f"diffusers {asked.version} ({asked.origin}): {what} runs in a process that imports it")
    env = dict(os.environ, PYTHONPATH=child_pythonpath(asked.site))
    proc = subprocess.Popen([sys.executable, "-m", "lab", *sys.argv[1:]], env=env, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the child is saving what it measured
        print("Interrupted.", file=sys.stderr)
        return code if code else 130


def fixes_for(scenario, spec: str, *, required: bool = False, settings: Sequence[str] = ()) -> tuple[list, list[str]]:
    """The fixes named by `--fix` that apply to the scenario (in `settings`, as `settings_of` gives them), and a note
    for each one skipped (`all`, upstream)."""
    from lab.apply.fix import check_fixes_for, parse_fix_list

    if not spec and not required:
        return [], []
    fixes, notes = check_fixes_for(scenario.name, parse_fix_list(spec), skip_inapplicable=spec == "all",
                                   settings=settings)
    for note in notes:
        progress(note)
    if required and not fixes:
        raise UsageError(f"No fix applies to `{scenario.name}` on this diffusers; nothing to compare.")
    return fixes, notes


def run_of(args: argparse.Namespace, scenario=None, device: str | None = None):
    """The run the options describe (`lab.run.description.Run`): made once, and the build, the worker's message, the
    result's name and header and the resume identity all derived from it."""
    from lab.run.description import Run
    from lab.run.scenario import default_device, default_size

    device = device or args.device or default_device()
    # (the scenario by name: a census's `--pipeline a,b` names several, and each of its builds passes its own)
    return Run(scenario=scenario.name if scenario is not None else args.pipeline,
               size=args.size or default_size(device), device=device,
               dtype=getattr(args, "dtype", None), layers=getattr(args, "layers", None),
               steps=getattr(args, "steps", naming.DEFAULT_STEPS), call=getattr(args, "call", None),
               full_decode=bool(getattr(args, "full_decode", False)), checkpoint=getattr(args, "checkpoint", None),
               seed=getattr(args, "seed", 0), settings=tuple(getattr(args, "setting", None) or ()),
               compile=compile_spec(args) if hasattr(args, "mode") else Run.compile,
               diffusers=getattr(args, "diffusers_version", None))


def build_from_args(args: argparse.Namespace, scenario=None):
    """The pipeline the options describe, built (not compiled: the caller compiles it as its command does), with
    progress lines before and after."""
    from lab.run.scenario import fmt_params, get_scenario

    scenario = scenario or get_scenario(args.pipeline)
    run = run_of(args, scenario)
    run.check()
    progress(f"building {scenario.name} at size `{run.size}` on {run.device}"
             + ("" if args.size else " (default for this machine)")
             + (f", {run.layers} transformer blocks" if run.layers else "") + " ...")
    built = run.build(compiled=False)
    progress(f"built {scenario.pipeline_cls.rsplit('.', 1)[-1]}: {fmt_params(built.params)} parameters, {built.dtype}"
             + "".join(f"; {n}" for n in built.notes))
    return built


def check_settings(args: argparse.Namespace, scenario, device: str) -> None:
    """Refuse a `--setting` this pipeline or device cannot take, before anything is built (`lab.run.settings.check`)."""
    from lab.run import settings
    from lab.run.scenario import setting_target

    chosen = settings.parse_all(getattr(args, "setting", None))
    if chosen:
        settings.check(chosen, scenario.name, setting_target(scenario), device)


def settings_of(args: argparse.Namespace) -> list[str]:
    """The `--setting` options as the result records them (`first_block_cache (threshold=0.05)`), checked."""
    from lab.run import settings

    return [s.describe() for s in settings.parse_all(getattr(args, "setting", None))]


def compile_spec(args: argparse.Namespace):
    from lab.run.runner import CompileSpec

    return CompileSpec(mode=args.mode, regional=args.compile_regional, fullgraph=args.compile_fullgraph,
                       compile_mode=args.compile_mode, backend=getattr(args, "compile_backend", "inductor"))


def prepared(args: argparse.Namespace):
    """The scenario, the applicable fixes, the built pipeline (compiled as asked) and the compile spec."""
    from lab.run.runner import apply_compile
    from lab.run.scenario import get_scenario

    scenario = get_scenario(args.pipeline)
    fixes, _ = fixes_for(scenario, args.fix, settings=settings_of(args))
    built = build_from_args(args, scenario)
    spec = compile_spec(args)
    apply_compile(built, spec)
    return scenario, fixes, built, spec


def size_tag(args: argparse.Namespace, device: str) -> str:
    """The size part of a result name (`lab.run.description.Run.size_tag`): `full`, `tiny`, `full-4l` with
    `--layers 4`, `full-4l-tinycall` with `--call tiny`, `full-2steps` with `--steps 2`, `full-decode` with
    `--full-decode`, `tiny-first_block_cache` with `--setting first_block_cache`."""
    return run_of(args, device=device).size_tag()


def device_tag(device: str) -> str:
    """The device part of a result name: `h200`, `h100`, ... or `cpu`."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return naming.device_tag_of(torch.cuda.get_device_name())


def _budget(text: str) -> float:
    try:
        return units.parse_duration(text)
    except ValueError as e:
        raise UsageError(f"`--budget {text}`: expected a positive time such as 90s, 10m or 1.5h.") from e


def ab_config(args: argparse.Namespace):
    """The A/B timing and decision settings from the options of `_options.ab_options`, checked."""
    from lab.measure.ab import ABConfig

    for option in ("repeat", "profile_calls", "min_blocks", "max_blocks"):
        if getattr(args, option, 1) < 1:
            raise UsageError(f"`--{option.replace('_', '-')}` must be at least 1.")
    if args.blocks is not None and args.blocks < 1:
        raise UsageError("`--blocks` must be at least 1.")
    if getattr(args, "pairs_at_once", 1) < 1:
        raise UsageError("`--pairs-at-once` must be at least 1.")
    if getattr(args, "pairs_at_once", 1) > 1 and getattr(args, "one_pair", False):
        raise UsageError("`--pairs-at-once` starts fresh pairs ahead; `--one-pair` keeps one pair: give one of them.")
    if args.warmup < 0 or args.lead_in < 0:
        raise UsageError("`--warmup` and `--lead-in` cannot be negative.")
    if args.min_blocks > args.max_blocks:
        raise UsageError(f"`--min-blocks {args.min_blocks}` is more than `--max-blocks {args.max_blocks}`.")
    if args.max_blocks > 400:
        raise UsageError("`--max-blocks` above 400 is not supported; use --budget to bound a long run instead.")
    if args.blocks is not None and args.budget:
        raise UsageError("`--budget` bounds a sequential run; a fixed design (`--blocks N`) runs all its blocks.")
    if not 0 < args.alpha < 0.5 or not 0 <= args.margin < 100:
        raise UsageError("`--alpha` must lie in (0, 0.5) and `--margin` (percent) in [0, 100).")
    return ABConfig(blocks=args.blocks, min_blocks=args.min_blocks, max_blocks=args.max_blocks,
                    budget_s=_budget(args.budget) if args.budget else None, lead_in=args.lead_in,
                    warmup=args.warmup, repeat=args.repeat, alpha=args.alpha, margin=args.margin / 100, seed=args.seed,
                    profile=getattr(args, "profile", False), with_stack=getattr(args, "with_stack", True),
                    profile_calls=getattr(args, "profile_calls", 1), timing_lock=getattr(args, "timing_lock", None),
                    one_pair=getattr(args, "one_pair", False), pairs_at_once=getattr(args, "pairs_at_once", 1),
                    bound=getattr(args, "bound", "off"))


def aside(path: Path, trace_dir: str) -> Path:
    """Where an interrupted run writes when a result is already at `path`: a `--replace` cut short keeps the result
    it was to replace, and this run's part goes to `<trace-dir>/interrupted/<scenario>/` instead."""
    return Path(trace_dir) / "interrupted" / path.parent.name / path.name

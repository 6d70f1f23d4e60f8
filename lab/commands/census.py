"""`lab census`: every pipeline (or a list), profiled without fixes, with each applicable fix alone and with all of
them together; one page per pipeline and one table over all of them."""

from __future__ import annotations

import argparse
import dataclasses
import gc
from pathlib import Path

from lab.base import files, naming, outputs
from lab.base.errors import LabError, describe_failure, during_interruption, raise_if_interrupted
from lab.commands._options import compile_options, scenario_options
from lab.commands._shared import (
    aside,
    build_from_args,
    command_line,
    compile_spec,
    device_tag,
    in_process_of,
    other_diffusers,
    progress,
    quietly,
    read_result,
    settings_of,
    size_tag,
)
from lab.run import copy_rates

HELP = "syncs, copies and CPU gaps of every pipeline, without and with the catalog's fixes, in one table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    scenario_options(p, pipeline_required=False)
    compile_options(p)
    p.set_defaults(pipeline="all")
    p.add_argument("--out", default="results/census", help="where the pages and the table go (default results/census)")
    p.add_argument("--replace", action="store_true",
                   help="measure every pipeline again (default: keep the pipelines already measured with these "
                        "settings, and measure again the ones that failed or lack a fix the catalog now applies)")
    p.add_argument("--arms", choices=("each", "ends"), default="each",
                   help="each: without fixes, with each applicable fix alone and with all of them (default); ends: "
                        "without fixes and with all of them, what the fixes leave without which fix removes what "
                        "(under compile every arm compiles again: two arms instead of up to nine)")
    p.add_argument("--trace-dir", default="traces", help="where the profiled calls' traces go (default traces/)")
    p.add_argument("--diffusers", metavar="SPEC",
                   help="census another diffusers than the installed one: a release (0.42.1, its wheel from "
                        "LAB_WHEELS or pip's cache), a checkout, a site-packages folder or a wheel; it runs in a "
                        "process that imports it first, and its pages and table are named for its version "
                        "(`full-2l-diffusers0.42.1`), beside the installed one's")


def run(args: argparse.Namespace) -> int:
    from lab.run.scenario import default_device, default_size, parse_scenarios

    scenarios = parse_scenarios(args.pipeline)
    if args.diffusers:
        asked = other_diffusers(args.diffusers)
        if asked.site is not None:
            return in_process_of(asked, "the census")
        args.diffusers_version = asked.version
    device = args.device or default_device()
    args.size = args.size or default_size(device)
    tag, dev = size_tag(args, device), device_tag(device)
    out = Path(args.out)
    arms = ("with each applicable fix alone and with all of them" if args.arms == "each" else
            "with all applicable fixes")
    names = [naming.census_name(scenario.name, args.mode, tag, dev) for scenario in scenarios]
    table = out / f"{naming.census_table_name(args.mode, tag, dev)}.md"
    # where the pages, the table and the traces go, before anything is built; each pipeline's result is this run's
    outputs.check(out, [f"{n}.md" for n in names] + [table.name], claim=[f"{n}.json" for n in names])
    outputs.check(args.trace_dir, [f"census_{n}.log" for n in names], option="--trace-dir")
    progress(f"census of {len(scenarios)} pipelines ({args.size}, {args.mode}) on {device}: without fixes and {arms}; "
             f"pages in {out}/")
    try:
        measured, kept, failed = _each_pipeline(args, scenarios, names, out)
    finally:  # the table holds every pipeline measured so far, an interrupted census included
        _write_table(table, out, args.mode, tag, dev)
    print(table.read_text() if table.exists() else "")
    progress(f"{measured} measured, {kept} kept from before, {len(failed)} failed"
             + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


def _each_pipeline(args: argparse.Namespace, scenarios: list, names: list[str], out: Path) -> tuple[int, int, list]:
    """Each pipeline's census, measured, or kept where it was measured before with what the census records now;
    how many were measured and kept, and which failed."""
    from lab.pages import census_report

    measured, kept, failed = 0, 0, []
    done: list[str] = []  # the pipelines this run measured or kept, for an interruption to name
    for i, scenario in enumerate(scenarios, 1):
        path = out / f"{names[i - 1]}.json"
        head = f"[{i}/{len(scenarios)}] {scenario.name}"
        left = [s.name for s in scenarios[i:]]
        if path.exists() and not args.replace:
            if _kept(path, head):
                kept += 1
                done.append(scenario.name)
                continue
        else:
            progress(f"{head} ...")
        try:
            result = census_of(args, scenario, names[i - 1])
        except Interrupted as stop:  # what completed of this pipeline is kept, to be measured again on resume
            where = _keep_interrupted(path, stop.result, args.trace_dir)
            progress(f"interrupted: {scenario.name}: kept its {len(stop.result.arms)} complete arm(s) in {where} "
                     "(owed: `lab census` measures it again); its other arms were not measured" + _so_far(done, left))
            raise
        except KeyboardInterrupt:  # outside a pipeline's arms (reading or writing a result)
            progress(f"interrupted: {scenario.name} not measured" + _so_far(done, left))
            raise
        _save(path, result)
        done.append(scenario.name)
        measured += 1
        if result.error:
            failed.append(scenario.name)
            progress(f"{head}: FAILED: {result.error}")
        else:
            progress(f"{head}: {census_report.verdict(result)} ({path.with_suffix('.md')})")
    return measured, kept, failed


def _kept(path: Path, head: str) -> bool:
    """Whether the census at `path`, measured before, is kept (said either way): it completed, has every fix the
    catalog now applies, and records the device work and the GPU-side waste."""
    from lab.apply.fix import census_lacks

    before = read_result(path)
    missing = census_lacks(before)
    if before.error is None and not missing and before.waste is not None:
        progress(f"{head}: kept (measured before; --replace measures it again)")
        return True
    progress(f"{head}: interrupted before; measuring again" if before.interrupted else
             f"{head}: failed before ({before.error}); measuring again" if before.error else
             f"{head}: measured before the catalog had {', '.join(missing)}; measuring again" if missing
             else f"{head}: measured before the census recorded the device work and the GPU-side waste; "
                  "measuring again")
    return False


def _so_far(done: list[str], left: list[str]) -> str:
    """What an interruption leaves: the pipelines kept from this run, and those not measured."""
    return ((f"; kept from this run: {', '.join(done)}" if done else "")
            + (f"; not measured: {', '.join(left)}" if left else ""))


def _write_table(table: Path, out: Path, mode: str, tag: str, dev: str) -> None:
    """The census table of `out`'s pipelines at this size and mode, from every census of the folder: a table in a
    setting says what the setting adds to the census without it."""
    from lab.pages import census_report

    found = [(p, r) for p in files.written(sorted(out.glob(f"*__{mode}__*__{dev}.json")))
             for r in [read_result(p)]
             if r.kind == "census"]
    in_table = [p for p, _ in found if p.stem.endswith(f"__{mode}__{tag}__{dev}")]
    if in_table:
        files.write_text(table, census_report.pages(found)[table])
        progress(f"wrote {table} ({len(in_table)} pipelines)")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a pipeline: `result` holds the arms that completed, marked `interrupted`."""

    def __init__(self, result) -> None:
        super().__init__()
        self.result = result


def _keep_interrupted(path: Path, result, trace_dir: str) -> Path:
    """Where an interrupted pipeline's arms go: in place, unless a complete census is there (a `--replace` cut
    short), which stays until a complete one replaces it; then beside the traces (`aside`), as `lab ab` does."""
    if path.exists() and read_result(path).error is None:
        kept, path = path, aside(path, trace_dir)
        progress(f"interrupted: {kept} is complete and kept; this run's arms go to {path}")
    _save(path, result)
    return path


def _save(path: Path, result) -> None:
    from lab import results
    from lab.pages import census_report

    results.write(path, result, replace=True)
    files.write_text(path.with_suffix(".md"), census_report.markdown(result))


def census_of(args: argparse.Namespace, scenario, name: str):
    """One pipeline's census result; a failure (while building or in any arm) is recorded in it with the arms that
    completed, and the census goes on. Ctrl-C raises `Interrupted` with the same, marked `interrupted`."""
    import msgspec
    import torch

    from lab import results
    from lab.apply.fix import catalog, check_fixes_for, each_sets
    from lab.measure.census import measure_arm
    from lab.measure.waste import watch_call
    from lab.results.schema import CENSUS_INTERRUPTED, CensusResult
    from lab.run.runner import apply_compile, regional_compile_possible

    settings = settings_of(args)
    arms, what, error, built, skipped, interrupted = [], "", None, None, [], False
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    base = {"name": name, "created": results.now(), "command": command_line(), "scenario": scenario.name,
            "size": args.size, "layers": args.layers, "steps": args.steps, "mode": compile_spec(args).describe(),
            "settings": settings_of(args),  # recorded before the build, so that a refused setting names itself
            "diffusers": getattr(args, "diffusers_version", None),
            "environment": results.environment(device, copy_rates.rates(device))}
    try:
        sets = [[]] + [fixes for fixes, _ in each_sets(scenario.name, settings)]
        if args.arms == "ends" and len(sets[-1]) > 1:  # the joint set, and alone any fix that conflicts with it
            joint = {f.name for f in sets[-1]}
            sets = [[], sets[-1]] + [s for s in sets[1:-1] if s[0].name not in joint]
        _, notes = check_fixes_for(scenario.name, list(catalog().values()), skip_inapplicable=True, settings=settings)
        skipped = [n.removeprefix("skipped: ") for n in notes]
        built = build_from_args(args, scenario)
        base.update(build=built.build, settings=built.settings, steps=built.steps)
        spec = compile_spec(args)
        if spec.mode == "compile" and spec.regional and not regional_compile_possible(built):
            spec = dataclasses.replace(spec, regional=False)  # as a user of this model compiles it: whole
            progress(f"  {type(getattr(built.pipe, scenario.denoiser)).__name__} has no repeated blocks to compile "
                     "regionally: compiling the whole model")
            base["mode"] = spec.describe()
        apply_compile(built, spec)
        log = Path(args.trace_dir) / f"census_{name}.log"
        for fixes in sets:
            raise_if_interrupted()  # one whose exception a finalizer swallowed during the last arm
            progress(f"  {'with ' + ', '.join(f.name for f in fixes) if fixes else 'without fixes'} ...")
            first = not arms and spec.mode == "compile"
            with quietly(log):
                arm, what = measure_arm(built, fixes, Path(args.trace_dir), f"census_{name}_{len(arms)}", args.seed,
                                        compiled=args.mode == "compile", progress=progress,
                                        compiler=base.setdefault("compiler", {}) if first else None)
            arms.append(arm)
        raise_if_interrupted()
        progress("  without fixes, watched for GPU-side waste ...")
        with quietly(log):
            base["waste"] = watch_call(built, args.seed)
    except KeyboardInterrupt:
        error, interrupted = CENSUS_INTERRUPTED, True
    except Exception as e:
        if during_interruption(e):  # a cleanup that failed on the way out of the interruption is the interruption
            error, interrupted = CENSUS_INTERRUPTED, True
        elif isinstance(e, LabError):
            error = str(e)
        else:  # a failure inside diffusers or torch: recorded, and the census goes on
            error = describe_failure(e)
    finally:
        if built is not None and built.undo_settings is not None:
            built.undo_settings()
        del built
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result = msgspec.convert({**base, "what": what, "arms": arms, "skipped": skipped, "error": error}, CensusResult,
                             from_attributes=True)
    if interrupted:
        raise Interrupted(result)
    return result

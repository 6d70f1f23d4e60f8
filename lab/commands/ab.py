"""`lab ab`: a fix (or a set, or each fix in turn) against the same build without it: verify, profile, time, decide."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lab.base import naming, outputs
from lab.base.errors import LabError, UsageError, describe_failure
from lab.commands._options import ab_options, compile_options, scenario_options
from lab.commands._shared import (
    ab_config,
    build_from_args,
    command_line,
    compile_spec,
    compiler_log,
    device_tag,
    fixes_for,
    in_process_of,
    other_diffusers,
    progress,
    quietly,
    say_where_output_went,
    settings_of,
    size_tag,
    worker_build,
)
from lab.verdicts.verdict import Verdict

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
    p.add_argument("--base", metavar="SET",
                   help="NAME[,NAME..]: fixes on in both arms, so that the A/B measures what --fix adds over them; a "
                        "base fix that a tested fix conflicts with gives way to it in the test arm (`--fix "
                        "model_offload_pinned --base model_offload_keep_host` times one against the other)")
    p.add_argument("--control", choices=("off", "aa"), default="off",
                   help="off: control runs without the fixes; aa: both arms run the same code (calibration)")
    g = p.add_argument_group("any change (README: test your own change)")
    g.add_argument("--patch", action="append", metavar="DIFF",
                   help="a unified diff of diffusers source (`git diff` in a checkout: paths src/diffusers/...) as "
                        "the test arm, applied in memory; repeat to stack diffs; combines with --fix")
    g.add_argument("--tolerance", type=float,
                   help="largest max-abs difference of the outputs that still counts as equal (default: 0 for a "
                        "diff, the fix's own for a catalog fix)")
    g.add_argument("--control-diffusers", metavar="SPEC",
                   help="the control arm's diffusers: a release (0.37.1, from a wheel folder or pip's cache), a "
                        "checkout, a site-packages folder or a wheel (default: the installed one)")
    g.add_argument("--test-diffusers", metavar="SPEC", help="the test arm's diffusers (as --control-diffusers)")
    p.add_argument("--diffusers", metavar="SPEC",
                   help="run the A/B (both arms) on another diffusers than the installed one, as --control-diffusers "
                        "names one (a release such as 0.42.1, a checkout, a site-packages folder or a wheel), in a "
                        "process that imports it first; the result is named for its version (`full-diffusers0.42.1`)")
    ab_options(p)
    p.add_argument("--resume", action="store_true",
                   help="go on from an existing result that a sequential run left undecided (budget spent or "
                        "interrupted): its blocks count and the looks go on under the same design (same timing "
                        "options and software); with --replace, a result that cannot go on is run afresh")
    p.add_argument("--out", default="results/ab", help="results directory (default results/ab)")
    p.add_argument("--name", help="result name (default: <fixes>__<mode>__<size>__<device>)")


def fix_sets(scenario, specs: list[str], settings: Sequence[str] = ()) -> list[tuple[list, list[str]]]:
    """The fix sets one `lab ab` compares, each with its notes: one per `--fix` (the named fixes together), and
    `each` for every applicable fix alone and then all together (`lab.apply.fix.each_sets`). A set named twice runs once."""
    from lab.apply.fix import each_sets

    sets: list[tuple[list, list[str]]] = []
    for spec in specs:
        if spec != "each":
            sets.append(fixes_for(scenario, spec, required=True, settings=settings))
            continue
        found = each_sets(scenario.name, settings)
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
    from lab import results
    from lab.apply.fix import over
    from lab.measure import ab, cell
    from lab.run.runner import apply_compile
    from lab.run.scenario import BUILD, default_device, default_size, get_scenario

    scenario = get_scenario(args.pipeline)
    outputs.check_name(args.name)
    if args.tolerance is not None and not 0 <= args.tolerance < math.inf:  # (NaN compares false with everything)
        raise UsageError(f"`--tolerance {args.tolerance}`: the largest difference of the outputs that still counts as "
                         "equal is a finite number, 0 or more.")
    if args.diffusers:
        if args.control_diffusers or args.test_diffusers:
            raise UsageError("`--diffusers` runs both arms on one other diffusers, `--control-diffusers`/"
                             "`--test-diffusers` compare two diffusers: pass one or the other.")
        asked = other_diffusers(args.diffusers)
        if asked.site is not None:
            return in_process_of(asked, "the A/B")
        args.diffusers_version = asked.version
    versions = _versions(args)
    patch_fix, patches = _patches(args)
    specs = args.fix or [""]
    if args.control == "aa" or versions or (patches and not args.fix):
        sets = [([], [])]
    else:
        sets = fix_sets(scenario, specs, settings_of(args))
    base = _base(args, scenario, sets)
    base_names = [b.name for b in base]
    if base:
        sets = [(fixes, notes) for fixes, notes in sets if not {f.name for f in fixes} <= set(base_names)]
    if patch_fix is not None:
        sets = [(fixes + [patch_fix], notes) for fixes, notes in sets]
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
    environment = results.environment(device) if args.resume else None  # what a result must share to go on
    for fixes, notes in sets:
        names = [naming.diffusers_tag(versions[0].version, versions[1].version)] if versions else [f.name for f in fixes]
        tag = naming.fix_tag(names, base_names)
        name = args.name or naming.ab_name(names, args.mode, size_tag(args, device), device_tag(device), base_names)
        where = cell.paths(Path(args.out), scenario.name, name)
        outputs.check(args.out, [p.relative_to(args.out) for p in where.values()])  # before a look at what is there
        identity = {"scenario": scenario.name, "size": size, "layers": args.layers, "steps": args.steps,
                    "mode": spec.describe(), "fixes": [f.name for f in fixes], "base": base_names,
                    "control": args.control,
                    "isolated": bool(args.isolate), "patches": patches.to_dict() if patches else None,
                    "diffusers": {"control": versions[0].to_dict(), "test": versions[1].to_dict()} if versions
                    else None, "environment": environment,
                    "build": "pretrained" if size == "pretrained" else BUILD, "settings": settings_of(args)}
        todo = cell.plan(where, replace=args.replace, resume=args.resume, identity=identity, config=config)
        if not todo.run:
            if not each:
                raise UsageError(todo.note)
            progress(f"kept {todo.note}")
            continue
        if todo.note:
            progress(todo.note)
        planned.append((fixes, notes, tag, name, where, todo.prior))
    if not planned:
        return 0
    # where the results and traces go, before anything is built: a run that cannot keep its result is not run; its
    # results are this run's until it ends
    outputs.check(args.out, claim=[where["json"].relative_to(args.out) for *_, where, _ in planned])
    outputs.check(args.trace_dir, [f"{scenario.name}_{name}.log" for _, _, _, name, _, _ in planned],
                  option="--trace-dir")
    if args.isolate:
        from lab.run.worker import IsolatedArm

        progress(f"starting one worker process per arm (each builds {scenario.name} at size `{size}` on {device}) ...")
        b = worker_build(args, scenario, size, device)
        built = None
        info = {"size": size, "layers": args.layers, "steps": args.steps, "device": device,
                "build": "pretrained" if size == "pretrained" else BUILD,  # the workers build with `build` too
                "settings": settings_of(args), "decoded": bool(args.full_decode)}
    else:
        started = time.perf_counter()
        built = build_from_args(args, scenario)
        apply_compile(built, spec)
        info = {"size": built.size, "layers": built.layers, "steps": built.steps, "device": built.device,
                "build": built.build, "build_s": time.perf_counter() - started, "settings": built.settings,
                "decoded": built.decodes}

    def arms(fixes: list) -> tuple:
        on_control, on_test = over(base, fixes)
        if args.isolate:
            c = versions[0] if versions else None
            t = versions[1] if versions else None
            control = IsolatedArm("control", on_control, b, dataclasses.asdict(spec), diffusers=c, start=False)
            test = IsolatedArm("test", on_test, b, dataclasses.asdict(spec), patches=tuple(args.patch or ()),
                               diffusers=t, start=False)
            try:  # the two workers build side by side (as `WorkerPairs` starts its pairs), not one after the other
                for arm in (control, test):
                    arm.start()
                for arm in (control, test):
                    arm.wait_ready()
            except BaseException:
                control.close()
                test.close()
                raise
            return control, test
        return ab.Arm("control", on_control), ab.Arm("test", on_test)

    failed = 0
    for i, (fixes, notes, tag, name, where, prior) in enumerate(planned):
        if each:
            progress(f"\n[{i + 1}/{len(planned)}] {scenario.name}: A/B of {tag}")
        extra = {}
        if getattr(args, "diffusers_version", None):
            extra["on_diffusers"] = args.diffusers_version
        if patches is not None:
            extra["patches"] = patches.to_dict()
        if versions:
            extra["diffusers"] = {"control": versions[0].to_dict(), "test": versions[1].to_dict()}
        if base:
            extra["base"] = base_names
        rest = [t for _, _, t, _, _, _ in planned[i + 1:]]
        files_before = _stamps(where, args.trace_dir)
        try:
            try:
                result = _one(args, scenario, built, spec, arms(fixes), config, fixes, notes, name, info, prior, extra)
            except (LabError, KeyboardInterrupt):
                raise
            except Exception as e:  # with `each`, one fix set failing keeps the others' results
                if not each:
                    raise
                print(f"ERROR: {tag}: {describe_failure(e)}", file=sys.stderr)
                failed += 1
                continue
            written = cell.write(result, where, args.trace_dir, went_on=prior is not None, progress=progress)
            _print(result, scenario.name, tag, written)
        except KeyboardInterrupt:  # before its blocks, or again while its result was being written
            kept = [str(p) for p, stamp in _stamps(where, args.trace_dir).items() if stamp != files_before.get(p)]
            progress(f"interrupted: {tag}: " + (f"kept {', '.join(kept)}" if kept else "nothing of it was written")
                     + (f"; not run: {', '.join(rest)}" if rest else ""))
            raise
        failed += result.verdict is Verdict.OUTPUTS_DIFFER
        if result.interrupted:  # Ctrl-C in the blocks ends this set (its blocks kept) and the command
            blocks = result.stats.n if result.stats else 0
            progress(f"interrupted: {tag}: kept its {blocks} complete block(s) in {written['json']} (`--resume` goes "
                     "on from them); the blocks after them were not run"
                     + (f"; not run: {', '.join(rest)}" if rest else ""))
            return 130
        if result.stopped == "time limit" and rest:
            # A campaign's time limit stopped this set's blocks: the next set could only warm up and verify past it
            # (on four H200s a job stopped there was still verifying its next set when the host's limit came).
            progress(f"the campaign's time limit: not run: {', '.join(rest)} (the next run goes on from here)")
            return 130
    return 1 if failed else 0


def _stamps(where: dict[str, Path], trace_dir: str) -> dict[Path, int | None]:
    """When each file an A/B cell may write was last changed (None: absent), in its place and aside
    (`cell.aside`): what an interruption leaves written is what changed."""
    from lab.measure import cell

    paths = [*where.values(), *(cell.aside(p, trace_dir) for p in where.values())]
    return {p: p.stat().st_mtime_ns if p.exists() else None for p in paths}


def _one(args, scenario, built, spec, arms, config, fixes, notes, name, info, prior=None, extra=None):
    """One A/B run of one fix set over the shared build, as its typed result; with `prior`, the result it goes on
    from (its blocks first, and `segments` saying which run measured which)."""
    from lab.measure import ab, cell

    control, test = arms
    log = Path(args.trace_dir) / f"{scenario.name}_{name}.log"
    try:
        with quietly(log), compiler_log(spec if not args.isolate else None, Path(args.trace_dir),
                                        f"{scenario.name}_{name}") as compiled:
            outcome = ab.run(built, spec, control, test, config, Path(args.trace_dir), f"{scenario.name}_{name}", progress,
                             compile_log=compiled, tolerance=args.tolerance if args.tolerance is not None else (
                                 0.0 if args.patch else None), time_differing=bool(args.control_diffusers or
                                                                                    args.test_diffusers), prior=prior)
    finally:
        for arm in (control, test):
            if hasattr(arm, "close"):
                arm.close()
    say_where_output_went(log)
    result = ab.record(name=name, command=command_line(), scenario=scenario, info=info, spec=spec, config=config,
                       fixes=[f.name for f in fixes], control=args.control, notes=notes, isolated=args.isolate,
                       outcome=outcome, **(extra or {}))
    return cell.continued(prior, result) if prior is not None else result


def _base(args: argparse.Namespace, scenario, sets: list) -> list:
    """The fixes of `--base`, on in both arms (checked as `--fix` is: each must apply here, in the settings); none
    without it. A set that holds nothing but base fixes would compare the base with itself: it is left out, and a
    command left with no set is refused."""
    if not args.base:
        return []
    if args.control == "aa" or args.control_diffusers or args.test_diffusers:
        raise UsageError("`--base` turns fixes on in both arms of a fix's A/B: it takes no `--control aa`, "
                         "`--control-diffusers` or `--test-diffusers`.")
    if args.base in ("all", "each"):
        raise UsageError("`--base` takes fix names (`--base model_offload_keep_host`), not `all` or `each`.")
    base, _ = fixes_for(scenario, args.base, required=True, settings=settings_of(args))
    names = {b.name for b in base}
    if all({f.name for f in fixes} <= names for fixes, _ in sets):
        raise UsageError(f"Every fix set named is in `--base {args.base}`: the arms would run the same code. Name "
                         "fixes to measure over the base with `--fix`.")
    return base


def _versions(args: argparse.Namespace) -> tuple | None:
    """The two diffusers of `--control-diffusers` / `--test-diffusers` (the installed one for the side not named);
    each arm then runs in a worker process of its own."""
    if not (args.control_diffusers or args.test_diffusers):
        return None
    from lab.apply import releases

    if args.fix or args.patch or args.control == "aa":
        raise UsageError("`--control-diffusers`/`--test-diffusers` compare two diffusers as they are: they take no "
                         "`--fix`, `--patch` or `--control aa` (to test a change on another diffusers, make a "
                         "checkout with it and pass it as `--test-diffusers`).")
    pair = tuple(releases.resolve(s) if s else releases.installed() for s in (args.control_diffusers, args.test_diffusers))
    progress(f"control: diffusers {pair[0].version} ({pair[0].origin}); test: diffusers {pair[1].version} "
             f"({pair[1].origin})")
    args.isolate = True
    return pair


def _patches(args: argparse.Namespace) -> tuple:
    """`--patch` files as one change (checked against the installed diffusers here, before anything is built)."""
    if not args.patch:
        return None, None
    from lab.apply import change

    if args.control == "aa":
        raise UsageError("`--control aa` runs the same code in both arms: it takes no `--patch`.")
    fix, patches = change.load(args.patch)
    for note in patches.skipped:
        progress(f"skipped {note}")
    lines = sum(len(numbers) for _, numbers in fix.lines)
    progress(f"{fix.name}: changes {', '.join(f'`{t}`' for t in fix.targets)}; {lines} changed line(s) hold code")
    return fix, patches


def _print(result, scenario: str, tag: str, paths: dict[str, Path]) -> None:
    from lab.pages.report import metric_rows, time_accounting

    print(f"\n{scenario}, {tag}: {result.verdict_text.upper()} — {result.summary}")
    for row in metric_rows(result):
        print(f"  {row[0]}: {row[1]} -> {row[2]}")
    accounting = time_accounting(result)
    if accounting:
        print("  " + accounting)
    for w in result.warnings:
        print(f"  warning: {w}")
    print(f"wrote {paths['json']}, {paths['md'].name}, {paths['png'].name}")

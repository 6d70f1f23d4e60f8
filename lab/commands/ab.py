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
    compiler_log,
    device_tag,
    fixes_for,
    in_process_of,
    other_diffusers,
    progress,
    quietly,
    run_of,
    say_where_output_went,
    settings_of,
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


@dataclasses.dataclass(frozen=True)
class Cell:
    """One fix set of this `lab ab`: its fixes and notes, its tag and result name, where its files go, and the result
    it goes on from (`--resume`)."""

    fixes: list
    notes: list[str]
    tag: str
    name: str
    where: dict[str, Path]
    prior: object = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one `lab ab` compares, made once from the options: the run (`lab.run.description.Run`), the two
    diffusers of a cross-release A/B, the change given as diffs, the base fixes, and the cells."""

    run: object
    config: object
    base: list
    versions: tuple | None
    patches: object
    cells: list[Cell]

    @property
    def extra(self) -> dict:
        """The result fields beside the run's own: the other diffusers, the diffs, the base."""
        out: dict = {}
        if self.run.diffusers:
            out["on_diffusers"] = self.run.diffusers
        if self.patches is not None:
            out["patches"] = self.patches.to_dict()
        if self.versions:
            out["diffusers"] = {"control": self.versions[0].to_dict(), "test": self.versions[1].to_dict()}
        if self.base:
            out["base"] = [b.name for b in self.base]
        return out


def run(args: argparse.Namespace) -> int:
    from lab.run.scenario import get_scenario

    scenario = get_scenario(args.pipeline)
    _refuse(args)
    if args.diffusers:
        asked = other_diffusers(args.diffusers)
        if asked.site is not None:
            return in_process_of(asked, "the A/B")
        args.diffusers_version = asked.version
    plan = _plan(args, scenario)
    if not plan.cells:
        return 0
    # where the results and traces go, before anything is built: a run that cannot keep its result is not run; its
    # results are this run's until it ends
    outputs.check(args.out, claim=[c.where["json"].relative_to(args.out) for c in plan.cells])
    outputs.check(args.trace_dir, [f"{scenario.name}_{c.name}.log" for c in plan.cells], option="--trace-dir")
    built, build_s = _build(args, scenario, plan.run)
    return _run_cells(args, scenario, plan, built, build_s)


def _refuse(args: argparse.Namespace) -> None:
    """Options that cannot go together, refused before anything is looked at."""
    outputs.check_name(args.name)
    if args.tolerance is not None and not 0 <= args.tolerance < math.inf:  # (NaN compares false with everything)
        raise UsageError(f"`--tolerance {args.tolerance}`: the largest difference of the outputs that still counts as "
                         "equal is a finite number, 0 or more.")
    if args.diffusers and (args.control_diffusers or args.test_diffusers):
        raise UsageError("`--diffusers` runs both arms on one other diffusers, `--control-diffusers`/"
                         "`--test-diffusers` compare two diffusers: pass one or the other.")
    if args.control == "aa" and args.fix:
        raise UsageError("`--control aa` runs the same code in both arms: it takes no `--fix`.")


def _sets(args: argparse.Namespace, scenario, versions, patches, patch_fix) -> tuple[list, list]:
    """The fix sets to compare and the base fixes on in both arms."""
    specs = args.fix or [""]
    if args.control == "aa" or versions or (patches and not args.fix):
        sets = [([], [])]
    else:
        sets = fix_sets(scenario, specs, settings_of(args))
    base = _base(args, scenario, sets)
    if base:
        sets = [(fixes, notes) for fixes, notes in sets if not {f.name for f in fixes} <= {b.name for b in base}]
    if patch_fix is not None:
        sets = [(fixes + [patch_fix], notes) for fixes, notes in sets]
    if (len(sets) > 1 or "each" in specs) and (args.name or args.isolate):
        raise UsageError("`--name` names one result; with several fix sets every set gets its own default name."
                         if args.name else "`--isolate` builds the pipeline once per arm and run; run one fix set "
                         "per command with it.")
    return sets, base


def _plan(args: argparse.Namespace, scenario) -> Plan:
    """What this `lab ab` runs: the run description, the fix sets and, for each, whether it runs (kept, going on,
    or afresh: `lab.measure.cell.plan`)."""
    from lab import results
    from lab.measure import cell

    versions = _versions(args)
    patch_fix, patches = _patches(args)
    sets, base = _sets(args, scenario, versions, patches, patch_fix)
    config = ab_config(args)
    run = run_of(args, scenario)
    run.check()
    base_names = [b.name for b in base]
    environment = results.environment(run.device) if args.resume else None  # what a result must share to go on
    cells = []
    for fixes, notes in sets:
        names = [naming.diffusers_tag(versions[0].version, versions[1].version)] if versions else [f.name for f in fixes]
        tag = naming.fix_tag(names, base_names)
        name = args.name or naming.ab_name(names, args.mode, run.size_tag(), device_tag(run.device), base_names)
        where = cell.paths(Path(args.out), scenario.name, name)
        outputs.check(args.out, [p.relative_to(args.out) for p in where.values()])  # before a look at what is there
        identity = {**run.identity(), "fixes": [f.name for f in fixes], "base": base_names, "control": args.control,
                    "isolated": bool(args.isolate), "patches": patches.to_dict() if patches else None,
                    "diffusers": {"control": versions[0].to_dict(), "test": versions[1].to_dict()} if versions
                    else None, "environment": environment}
        todo = cell.plan(where, replace=args.replace, resume=args.resume, identity=identity, config=config)
        if not todo.run:
            if len(sets) == 1:
                raise UsageError(todo.note)
            progress(f"kept {todo.note}")
            continue
        if todo.note:
            progress(todo.note)
        cells.append(Cell(fixes, notes, tag, name, where, todo.prior))
    return Plan(run=run, config=config, base=base, versions=versions, patches=patches, cells=cells)


def _build(args: argparse.Namespace, scenario, run) -> tuple:
    """The pipeline both arms share, compiled, and the seconds it took; none where each arm builds its own
    (`--isolate`)."""
    if args.isolate:
        progress(f"starting one worker process per arm (each builds {scenario.name} at size `{run.size}` on "
                 f"{run.device}) ...")
        return None, None
    from lab.run.runner import apply_compile

    started = time.perf_counter()
    built = build_from_args(args, scenario)
    apply_compile(built, run.compile)
    return built, time.perf_counter() - started


def _arms(args: argparse.Namespace, plan: Plan, fixes: list) -> tuple:
    """The two arms of one cell: in this process, or each in a worker process of its own (built side by side, as
    `WorkerPairs` starts its pairs)."""
    from lab.apply.fix import over
    from lab.measure import ab

    on_control, on_test = over(plan.base, fixes)
    if not args.isolate:
        return ab.Arm("control", on_control), ab.Arm("test", on_test)
    from lab.run.worker import IsolatedArm

    versions = plan.versions or (None, None)
    control = IsolatedArm("control", on_control, plan.run, diffusers=versions[0], start=False)
    test = IsolatedArm("test", on_test, plan.run, patches=tuple(args.patch or ()), diffusers=versions[1], start=False)
    try:
        for arm in (control, test):
            arm.start()
        for arm in (control, test):
            arm.wait_ready()
    except BaseException:
        control.close()
        test.close()
        raise
    return control, test


def _run_cells(args: argparse.Namespace, scenario, plan: Plan, built, build_s) -> int:
    """Each cell in turn; its exit code: 130 when interrupted (its blocks kept), 1 when a cell failed."""
    from lab.measure import cell as cells

    failed = 0
    each = len(plan.cells) > 1 or "each" in (args.fix or [])
    for i, c in enumerate(plan.cells):
        if each:
            progress(f"\n[{i + 1}/{len(plan.cells)}] {scenario.name}: A/B of {c.tag}")
        rest = [x.tag for x in plan.cells[i + 1:]]
        files_before = _stamps(c.where, args.trace_dir)
        try:
            try:
                result = _one(args, scenario, built, build_s, _arms(args, plan, c.fixes), plan, c)
            except (LabError, KeyboardInterrupt):
                raise
            except Exception as e:  # with `each`, one fix set failing keeps the others' results
                if not each:
                    raise
                print(f"ERROR: {c.tag}: {describe_failure(e)}", file=sys.stderr)
                failed += 1
                continue
            written = cells.write(result, c.where, args.trace_dir, went_on=c.prior is not None, progress=progress)
            _print(result, scenario.name, c.tag, written)
        except KeyboardInterrupt:  # before its blocks, or again while its result was being written
            kept = [str(p) for p, stamp in _stamps(c.where, args.trace_dir).items() if stamp != files_before.get(p)]
            progress(f"interrupted: {c.tag}: " + (f"kept {', '.join(kept)}" if kept else "nothing of it was written")
                     + (f"; not run: {', '.join(rest)}" if rest else ""))
            raise
        failed += result.verdict is Verdict.OUTPUTS_DIFFER
        stop = _stopped(result, c.tag, written, rest)
        if stop is not None:
            return stop
    return 1 if failed else 0


def _stopped(result, tag: str, written: dict, rest: list[str]) -> int | None:
    """The exit code where this cell's end ends the command: a Ctrl-C in its blocks (its blocks kept), or a campaign's
    time limit (the next set could only warm up and verify past it); None where the next cell runs."""
    if result.interrupted:
        blocks = result.stats.n if result.stats else 0
        progress(f"interrupted: {tag}: kept its {blocks} complete block(s) in {written['json']} (`--resume` goes "
                 "on from them); the blocks after them were not run" + (f"; not run: {', '.join(rest)}" if rest else ""))
        return 130
    if result.stopped == "time limit" and rest:
        progress(f"the campaign's time limit: not run: {', '.join(rest)} (the next run goes on from here)")
        return 130
    return None


def _stamps(where: dict[str, Path], trace_dir: str) -> dict[Path, int | None]:
    """When each file an A/B cell may write was last changed (None: absent), in its place and aside
    (`cell.aside`): what an interruption leaves written is what changed."""
    from lab.measure import cell

    paths = [*where.values(), *(cell.aside(p, trace_dir) for p in where.values())]
    return {p: p.stat().st_mtime_ns if p.exists() else None for p in paths}


def _one(args, scenario, built, build_s, arms, plan: Plan, c: Cell):
    """One A/B run of one fix set over the shared build, as its typed result; going on from `c.prior`, the result
    holds which run measured which blocks (`segments`)."""
    from lab.measure import ab, cell

    control, test = arms
    spec = plan.run.compile
    log = Path(args.trace_dir) / f"{scenario.name}_{c.name}.log"
    tolerance = args.tolerance if args.tolerance is not None else (0.0 if args.patch else None)
    try:
        with quietly(log), compiler_log(spec if not args.isolate else None, Path(args.trace_dir),
                                        f"{scenario.name}_{c.name}") as compiled:
            outcome = ab.run(built, spec, control, test, plan.config, Path(args.trace_dir), f"{scenario.name}_{c.name}",
                             progress, compile_log=compiled, tolerance=tolerance,
                             time_differing=bool(args.control_diffusers or args.test_diffusers), prior=c.prior)
    finally:
        for arm in (control, test):
            if hasattr(arm, "close"):
                arm.close()
    say_where_output_went(log)
    result = ab.record(name=c.name, command=command_line(), scenario=scenario, run=plan.run, config=plan.config,
                       arms=arms, fixes=[f.name for f in c.fixes], control=args.control, notes=c.notes,
                       isolated=args.isolate, outcome=outcome, built=built, build_s=build_s, **plan.extra)
    return cell.continued(c.prior, result) if c.prior is not None else result


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

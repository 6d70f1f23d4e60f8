"""`lab history`: one pipeline over diffusers releases, each against a reference release, as a table and a plot."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from lab.base import files, naming, outputs
from lab.base.errors import UsageError
from lab.commands._options import ab_options, compile_options, scenario_options
from lab.commands._shared import (
    ab_config,
    command_line,
    device_tag,
    progress,
    run_of,
    settings_of,
    size_tag,
)
from lab.run import copy_rates

HELP = "a pipeline over diffusers releases: each against a reference, asv-style (table and plot)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--diffusers", required=True, metavar="SPEC[,SPEC..]",
                   help="the releases (0.37.1,0.38.0,...), checkouts or site-packages folders to compare; releases "
                        "come from a wheel folder (LAB_WHEELS) or pip's cache, offline")
    p.add_argument("--reference", metavar="SPEC", help="the release every other is compared with (default: the first)")
    scenario_options(p)
    compile_options(p)
    ab_options(p)
    p.add_argument("--out", default="results/history", help="where the history goes (default results/history)")
    p.add_argument("--ab-out", default="results/ab", help="where each pair's A/B result goes (default results/ab)")
    p.add_argument("--name", help="history name (default: <pipeline>__<mode>__<size>__<device>)")


def run(args: argparse.Namespace) -> int:
    import msgspec

    from lab import results
    from lab.measure.history import Setting, measure
    from lab.results.schema import HistoryResult
    from lab.run.scenario import default_device, get_scenario

    scenario = get_scenario(args.pipeline)
    outputs.check_name(args.name)
    settings_of(args)  # a setting refused before anything is resolved or built
    device = args.device or default_device()
    out = Path(args.out)
    name = args.name or naming.history_name(scenario.name, args.mode, size_tag(args, device), device_tag(device))
    page = out / f"{name}.json"
    # where the history goes, before any release is resolved (a download, perhaps) or built; it is this run's
    outputs.check(out, [f"{name}.md", f"{name}.png"], claim=[f"{name}.json"])
    versions, reference = _diffusers(args)
    run = run_of(args, scenario, device)
    run.check()  # a setting this pipeline or device refuses, before any worker builds
    size, spec = run.size, run.compile
    # where its pairs' A/B results and their traces go, before any worker builds; each is this run's
    pairs = [f"{scenario.name}/" + naming.ab_name([naming.diffusers_tag(reference.version, d.version)], args.mode,
                                                  size_tag(args, device), device_tag(device))
             for d in versions if d.version != reference.version]
    outputs.check(args.ab_out, [f"{p}{end}" for p in pairs for end in (".md", ".png")], option="--ab-out",
                  claim=[f"{p}.json" for p in pairs])
    outputs.check(args.trace_dir, option="--trace-dir")
    if page.exists() and not args.replace:
        progress(f"{page} exists: the pairs already measured are kept; --replace measures them all again")
    setting = Setting(scenario=scenario, run=run, config=ab_config(args), size_tag=run.size_tag(),
                      device_tag=device_tag(device), ab_dir=Path(args.ab_out), trace_dir=Path(args.trace_dir),
                      command=command_line(), replace=args.replace)
    started = time.perf_counter()
    rows = measure(setting, versions, reference, progress)
    history = msgspec.convert({
        "name": name, "created": results.now(),
        "command": command_line(), "scenario": scenario.name, "pipeline": scenario.pipeline_cls, "size": size,
        "layers": args.layers, "call": args.call or naming.own_call(size), "steps": args.steps,
        "mode": spec.describe(), "compile": dataclasses.asdict(spec),
        "reference": reference.to_dict(), "config": dataclasses.asdict(setting.config),
        "environment": results.environment(device, copy_rates.rates(device)),
        "seconds": time.perf_counter() - started, "releases": rows,
        "build": run.build_kind, "settings": run.described_settings,
    }, HistoryResult)  # where it steps and where the counts change are read off the rows by history_report, not stored
    _write(page, history)
    if rows and rows[-1].interrupted:
        left = [d.version for d in versions if d.version not in {r.version for r in rows}]
        progress("interrupted: the history keeps the pairs measured so far"
                 + (f"; not measured: {', '.join(left)}" if left else ""))
        return 130
    failed = [r for r in rows if r.status == "failed"]
    return 1 if failed else 0


def _diffusers(args: argparse.Namespace) -> tuple[list, object]:
    """The diffusers `--diffusers` and `--reference` name, resolved (the reference first where it is not among
    them), one per version, and the reference: each checked to be a row of its own."""
    from lab.apply import releases

    specs = [s.strip() for s in args.diffusers.split(",") if s.strip()]
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise UsageError(f"`--diffusers` names {', '.join(f'`{s}`' for s in twice)} twice: a history row is one "
                         "diffusers, so name each once.")
    if len(specs) + bool(args.reference and args.reference not in specs) < 2:
        raise UsageError("`--diffusers` needs at least two diffusers (or one and a `--reference`) to compare.")
    progress("resolving the diffusers ...")
    versions = [releases.resolve(s) for s in specs]
    reference = releases.resolve(args.reference) if args.reference else versions[0]
    if reference.version not in {d.version for d in versions}:
        versions.insert(0, reference)
    seen: dict[str, str] = {}
    for d in versions:
        if d.version in seen and seen[d.version] != d.origin:
            raise UsageError(f"Two of the diffusers are version {d.version} ({seen[d.version]}; {d.origin}): a "
                             "history row is one version.")
        seen[d.version] = d.origin
    versions = list({d.version: d for d in versions}.values())
    if len(versions) < 2:
        raise UsageError(f"`--diffusers` resolves to one diffusers ({versions[0].version}) only: a history needs two "
                         "different ones.")
    for d in versions:
        progress(f"  diffusers {d.version}: {d.origin}" + ("  (reference)" if d.version == reference.version else ""))
    return versions, reference


def _write(page: Path, history) -> None:
    """The history's result, its plot and its page, the page printed."""
    from lab import results
    from lab.pages import history_report

    page.parent.mkdir(parents=True, exist_ok=True)
    results.write(page, history, replace=True)
    png = history_report.plot(history, page.with_suffix(".png"))
    text = history_report.markdown(history, png.name if png else None, page_dir=page.parent)
    files.write_text(page.with_suffix(".md"), text)
    print("\n" + text)
    print(f"wrote {page}, {page.with_suffix('.md').name}" + (f", {png.name}" if png else ""))

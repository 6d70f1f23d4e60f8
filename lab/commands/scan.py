"""`lab scan`: a static libcst pass over diffusers source for sync-prone patterns."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from tabulate import tabulate

from lab.commands._shared import progress

HELP = "static scan of diffusers source for sync-prone patterns (file:line)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help="files or directories (default: the installed diffusers)")
    p.add_argument("--pipeline", help="scan the modules a scenario runs through instead")
    p.add_argument("--pattern", action="append", help="only these patterns (repeatable)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from lab.measure import scan
    from lab.run.scenario import get_scenario, resolve

    if args.pipeline:
        scenario = get_scenario(args.pipeline)
        classes = [scenario.pipeline_cls, scenario.scheduler[0]] + [m.cls for m in scenario.models.values()]
        modules = {resolve(c).__module__ for c in classes} | {"diffusers.hooks.hooks", "diffusers.models.cache_utils"}
        paths = scan.module_files(sorted(modules))
    else:
        paths = [Path(p) for p in args.paths] or [scan.diffusers_root() / "diffusers"]
    findings = scan.scan(paths, progress=progress)
    if args.pattern:
        findings = [f for f in findings if f.pattern in args.pattern]
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=1))
        return 0
    rows = [[f.where, f.function, f.pattern, f.code] for f in findings]
    print(tabulate(rows, headers=["file:line", "function", "pattern", "code"], maxcolwidths=[60, 40, 18, 60]))
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.pattern] = counts.get(f.pattern, 0) + 1
    print(f"\n{len(findings)} candidates: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0

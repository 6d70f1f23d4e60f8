"""`lab table`: the docs tables (`results/README.md`), every result's page and the fix catalog (`docs/fixes.md`),
regenerated from the result JSONs and the fixes' records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "regenerate results/README.md (the docs tables) and docs/fixes.md (the fix catalog) from the result JSONs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="results directory (default results/)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="allow results from different environments (GPU, torch, diffusers) in one table")
    p.add_argument("--restat", action="store_true",
                   help="first decide every result again from its stored blocks with the current rule, and read each "
                        "settings map's offload limits again at its copy rates (the measurements are kept; format-1 "
                        "results keep what their rule said)")
    p.add_argument("--redraw", action="store_true",
                   help="draw every A/B, sweep, calibration and settings map plot again from its JSON (--restat does too)")


def run(args: argparse.Namespace) -> int:
    from lab.base.errors import UsageError
    from lab.campaigns import campaign
    from lab.pages import fix_catalog, table
    from lab.results import store

    if args.restat:  # (a file it cannot decide from is an error before any file is rewritten)
        from lab.results.restat import restat

        changes = restat(Path(args.results))
        moved = [c for c in changes if c["from"] != c["to"]]
        print(f"re-decided {len(changes)} verdicts; {len(moved)} changed:")
        for c in moved:
            print(f"  {c['name']} ({c['path'].parent.name}): {c['from']} -> {c['to']}")
        from lab.measure.settings_map import read_limits_again

        limits = read_limits_again(Path(args.results) / "settings-map")
        shown = [limit for limit in limits if f"{limit[3]:.2f}" != f"{limit[4]:.2f}"]
        print(f"read {len(limits)} offload limits of the settings maps again at each map's copy rates; "
              f"{len(shown)} multiples moved" + (":" if shown else ""))
        for name, setting, arm, was, now in shown:
            print(f"  {name}: {setting}, {arm}: {was:.2f}x -> {now:.2f}x")
    results = Path(args.results)
    with store.one_reading():  # every result is read once, however many tables, pages and plots show it
        refused = table.refused(results)
        for error in refused.values():
            print(f"WARNING: {error} Left out of the tables, pages and plots.", file=sys.stderr)
        store.leave_out(refused)
        if args.restat or args.redraw:
            print(f"redrew {table.redraw(results)} plots")
        campaigns = campaign.states(results.parent / "campaigns", results)
        path = table.write(results, allow_mixed=args.allow_mixed, campaigns=campaigns, redraw=args.restat or args.redraw)
        catalog_page = fix_catalog.write(results, results.parent / "docs" / "fixes.md")
    print(f"wrote {path}")
    print(f"wrote {catalog_page}")
    if refused:
        raise UsageError(f"{len(refused)} result file(s) refused (each named above with its field): {path} and the "
                         "pages were written without them; restore each (`git checkout`) or measure it again.")
    return 0

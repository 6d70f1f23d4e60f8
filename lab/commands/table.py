"""`lab table`: the docs tables (`results/README.md`) and every result's page, regenerated from the result JSONs."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "regenerate results/README.md (the docs tables) from the result JSONs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="results directory (default results/)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="allow results from different environments (GPU, torch, diffusers) in one table")
    p.add_argument("--restat", action="store_true",
                   help="first decide every result again from its stored blocks with the current rule (the "
                        "measurements are kept; format-1 results keep what their rule said)")
    p.add_argument("--redraw", action="store_true",
                   help="draw every A/B, sweep and calibration plot again from its JSON (--restat does too)")


def run(args: argparse.Namespace) -> int:
    from lab.campaigns import campaign
    from lab.pages import table

    if args.restat:
        from lab.results.restat import restat

        changes = restat(Path(args.results))
        moved = [c for c in changes if c["from"] != c["to"]]
        print(f"re-decided {len(changes)} verdicts; {len(moved)} changed:")
        for c in moved:
            print(f"  {c['name']} ({c['path'].parent.name}): {c['from']} -> {c['to']}")
    if args.restat or args.redraw:
        print(f"redrew {table.redraw(Path(args.results))} plots")
    results = Path(args.results)
    campaigns = campaign.states(results.parent / "campaigns", results)
    path = table.write(results, allow_mixed=args.allow_mixed, campaigns=campaigns)
    print(f"wrote {path}")
    return 0

"""`lab diff`: a fix as a `git apply`-able upstream diff."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.commands._shared import progress
from lab.errors import UsageError

HELP = "print a fix as a git-apply-able upstream diff"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--fix", help="fix name")
    g.add_argument("--all", action="store_true", help="every fix with a source change")
    p.add_argument("--out", help="directory to write <fix>.diff files into (default: stdout)")


def run(args: argparse.Namespace) -> int:
    from lab.diff import fix_diff
    from lab.fix import catalog, get_fix

    fixes = [f for f in catalog().values() if f.rewrites] if args.all else [get_fix(args.fix)]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for fix in fixes:
            try:
                text = fix_diff(fix)
            except UsageError as e:
                progress(f"skipped {fix.name}: {e}")
                continue
            (out / f"{fix.name}.diff").write_text(text)
            progress(f"wrote {out / (fix.name + '.diff')}")
        return 0
    for fix in fixes:
        try:
            sys.stdout.write(fix_diff(fix))
        except UsageError as e:
            if not args.all:
                raise
            progress(f"skipped {fix.name}: {e}")
    return 0

"""`lab diff`: a fix as a `git apply`-able upstream diff, or with `--pr` what a pull request needs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.base import files
from lab.base.errors import UsageError
from lab.commands._shared import progress

HELP = "print a fix as a git-apply-able upstream diff (--pr: a pull request's diff and description)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lab.apply.releases import NEWEST

    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--fix", help="fix name")
    g.add_argument("--all", action="store_true", help="every fix with a source change")
    p.add_argument("--out", help="directory to write <fix>.diff files into (default: stdout)")
    p.add_argument("--pr", action="store_true",
                   help="against a release (--against) instead of the installed diffusers, with <fix>.md: what it "
                        "changes, why, and the committed results of the fix alone")
    p.add_argument("--against", default=NEWEST, metavar="VERSION",
                   help=f"with --pr: the release to diff against (default {NEWEST}; its wheel from LAB_WHEELS or pip)")
    p.add_argument("--results", default="results", help="with --pr: the results folder to quote (default results)")


def run(args: argparse.Namespace) -> int:
    from lab.apply.fix import catalog, get_fix

    fixes = [f for f in catalog().values() if f.rewrites] if args.all else [get_fix(args.fix)]
    if args.pr:
        return _pr(args, fixes)
    from lab.apply.diff import fix_diff

    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for fix in fixes:
            try:
                text = fix_diff(fix)
            except UsageError as e:
                progress(f"skipped {fix.name}: {e}")
                continue
            files.write_text(out / f"{fix.name}.diff", text)
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


def _pr(args: argparse.Namespace, fixes: list) -> int:
    from lab.pages.pr import pr_files

    out = Path(args.out) if args.out else None
    written: set[str] = set()
    for fix in fixes:
        if not fix.rewrites:
            if not args.all:
                raise UsageError(f"`{fix.name}` is a runtime patch with no source change: it has no pull request.")
            continue
        try:
            diff, text, joint = pr_files(fix, args.against, Path(args.results), out or Path("."))
        except UsageError as e:
            if not args.all:
                raise
            progress(f"skipped {fix.name}: {e}")
            continue
        if out is None:
            sys.stdout.write(diff + "\n" + text)
            continue
        out.mkdir(parents=True, exist_ok=True)
        files.write_text(out / f"{fix.name}.diff", diff)
        files.write_text(out / f"{fix.name}.md", text)
        progress(f"wrote {out / (fix.name + '.diff')}, {fix.name}.md")
        for name, together in joint.items():  # with each fix whose diff collides with this one's: the two at once
            if name not in written:
                written.add(name)
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                files.write_text(out / name, together)
                progress(f"wrote {out / name}")
    return 0

"""`lab upstream`: whether a pull request's diff is ready to go upstream; `check` runs diffusers' own tests with and
without it."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.base import files, outputs
from lab.base.errors import UsageError, unknown_name
from lab.commands._shared import command_line, progress

HELP = "check a fix's pull request diff against diffusers' own tests (check)"

#: where the PR diffs live (`lab diff --all --pr --out patches/pr/`) and where the reports go by default
DIFFS = Path("patches/pr")
OUT = Path("patches/checks")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("check", help="run diffusers' tests of the modules a PR diff touches, released and with the "
                                     "diff, and report what the diff changes",
                       description="Run diffusers' own tests of the modules a PR diff touches, on the release it was "
                                   "made from, with and without the diff; write <fix>.json and <fix>.md.")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--fix", help="the fix whose PR diff to check (<diffs>/<fix>.diff)")
    which.add_argument("--all", action="store_true", help="every PR diff in --diffs")
    suite = c.add_mutually_exclusive_group(required=True)
    suite.add_argument("--tests", type=Path, metavar="PATH",
                       help="diffusers' test suite as a folder holding tests/ (a diffusers checkout)")
    suite.add_argument("--repo", type=Path, metavar="PATH",
                       help="a diffusers git repository (bare or not) to take tests/ from, at --commit")
    c.add_argument("--commit", metavar="REV",
                   help="with --repo: the revision (default: the release's tag vX, else the newest release tag not "
                        "newer than it)")
    c.add_argument("--diffs", type=Path, default=DIFFS, help=f"the folder of PR diffs (default {DIFFS})")
    c.add_argument("--out", type=Path, default=OUT, help=f"where <fix>.json and <fix>.md go (default {OUT})")
    c.add_argument("--max-files", type=int, default=4, metavar="N",
                   help="run at most N test files per diff, those that name the touched modules most (default 4)")
    c.add_argument("--timeout", type=float, default=900, metavar="SECONDS",
                   help="the time limit of each run of the tests (default 900)")
    c.add_argument("--offline", action="store_true",
                   help="the runs do not ask the Hub (HF_HUB_OFFLINE=1): where it cannot be reached, a test that "
                        "downloads fails at once instead of after minutes of retries")
    # `--test-pipelines` (diffusers' tiny test pipelines, on a GPU) joins here as a second stage of the check:
    # `lab.apply.upstream` says how.


def run(args: argparse.Namespace) -> int:
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    from lab.apply import upstream
    from lab.pages.check_report import markdown

    if args.commit and not args.repo:
        raise UsageError("--commit names a revision of --repo: give --repo PATH with it.")
    if args.max_files < 1:
        raise UsageError(f"--max-files {args.max_files}: give 1 or more.")
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout}: give a number of seconds above 0.")
    diffs = _diffs(args)
    outputs.check(args.out, claim=[f"{name}.{ext}" for name in diffs for ext in ("json", "md")])
    options = upstream.Options(tests=args.tests, repo=args.repo, commit=args.commit, max_files=args.max_files,
                               timeout=args.timeout, offline=args.offline, command=command_line())
    done: list[str] = []
    failing: list[str] = []
    skipped: list[str] = []
    try:
        for name, path in diffs.items():
            try:
                report = upstream.check(name, path, options, say=progress)
            except UsageError as e:
                if not args.all:
                    raise
                progress(f"skipped {name}: {e}")
                skipped.append(name)
                continue
            files.write_text(args.out / f"{name}.json", upstream.encode(report))
            files.write_text(args.out / f"{name}.md", markdown(report))
            done.append(name)
            progress(f"{name}: {report.status} ({report.reason}); its own test: {report.proof}; wrote {args.out / name}.json, .md")
            if report.status in ("regressions", "does not apply") or report.proof == "not proven":
                failing.append(name)
    except KeyboardInterrupt:
        left = [n for n in diffs if n not in done and n not in skipped]
        progress(f"Interrupted: kept the reports of {', '.join(done) or 'none'}; not checked: {', '.join(left)}.")
        return 130
    if len(diffs) > 1:
        progress(f"checked {len(done)} of {len(diffs)} diffs" + (f"; skipped {', '.join(skipped)}" if skipped else "")
                 + (f"; regressions, not applying or not proven by their own test: {', '.join(failing)}"
                    if failing else ""))
    return 1 if failing else 0


def _diffs(args: argparse.Namespace) -> dict[str, Path]:
    """The PR diffs to check, by fix name: `--fix`'s, or every `*.diff` directly in `--diffs`."""
    found = {p.stem: p for p in sorted(args.diffs.glob("*.diff"))} if args.diffs.is_dir() else {}
    if args.all:
        if not found:
            raise UsageError(f"--diffs {args.diffs}: no PR diffs (*.diff) there; write them with `lab diff --all --pr "
                             f"--out {args.diffs}`.")
        return found
    if args.fix not in found:
        if not found:
            raise UsageError(f"--diffs {args.diffs}: no PR diffs (*.diff) there.")
        raise unknown_name("PR diff", args.fix, found)
    return {args.fix: found[args.fix]}

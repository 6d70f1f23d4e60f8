"""`lab upstream`: whether a pull request's diff is ready to go upstream; `check` runs its project's own tests
(diffusers', accelerate's) with and without it, its own regression test both ways, ruff, and with `--test-pipelines`
the tiny test pipelines."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.base import files, outputs
from lab.base.errors import UsageError, unknown_name
from lab.commands._shared import command_line, progress

HELP = "check a fix's pull request diff against its project's own tests (check)"

#: where the PR diffs live (`lab diff --all --pr --out patches/pr/`, and the hand-written accelerate ones) and where
#: the reports go by default
DIFFS = (Path("patches/pr"), Path("patches/accelerate"))
OUT = Path("patches/checks")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("check", help="run the project's own tests of the modules a diff touches, released and with "
                                     "the diff, and report what the diff changes",
                       description="Run a diff's project's own tests (diffusers', accelerate's) of the modules it "
                                   "touches, on the release it was made from, with and without the diff, and the "
                                   "diff's own regression test both ways; ruff the touched files; write <fix>.json "
                                   "and <fix>.md.")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--fix", help="the fix whose diff to check (<diffs>/<fix>.diff)")
    which.add_argument("--all", action="store_true", help="every diff in --diffs")
    c.add_argument("--tests", action="append", default=[], metavar="[PROJECT=]PATH",
                   help="a project's test suite as a folder holding tests/ (a checkout); the project is the package "
                        "its src/ holds, else diffusers (repeat for each project)")
    c.add_argument("--repo", action="append", default=[], metavar="[PROJECT=]PATH",
                   help="a git repository (bare or not) to take tests/ from, at --commit; the project is the package "
                        "its src/ holds (repeat for each project: diffusers', accelerate's)")
    c.add_argument("--commit", metavar="REV",
                   help="with one --repo: the revision (default: the release's tag vX, else the newest release tag "
                        "not newer than it)")
    c.add_argument("--diffs", type=Path, action="append", metavar="DIR",
                   help=f"a folder of diffs (repeatable; default {' and '.join(str(d) for d in DIFFS)})")
    c.add_argument("--out", type=Path, default=OUT, help=f"where <fix>.json and <fix>.md go (default {OUT})")
    c.add_argument("--max-files", type=int, default=4, metavar="N",
                   help="run at most N test files per diff, those that name the touched modules most (default 4)")
    c.add_argument("--timeout", type=float, default=900, metavar="SECONDS",
                   help="the time limit of each run of the tests (default 900)")
    c.add_argument("--offline", action="store_true",
                   help="the runs do not ask the Hub (HF_HUB_OFFLINE=1): where it cannot be reached, a test that "
                        "downloads fails at once instead of after minutes of retries")
    c.add_argument("--test-pipelines", action="store_true",
                   help="also build the suite's tiny test pipelines of the touched modules, run them released and "
                        "with the diff (on CUDA where torch finds it, else the CPU) and compare their outputs")


def run(args: argparse.Namespace) -> int:
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    from lab.apply import upstream
    from lab.pages.check_report import markdown

    if args.commit and len(args.repo) != 1:
        raise UsageError("--commit names a revision of one --repo: give exactly one --repo PATH with it.")
    if not args.tests and not args.repo:
        raise UsageError("give the test suites: --repo PATH (a git repository) or --tests PATH (a checkout), one per "
                         "project.")
    if args.max_files < 1:
        raise UsageError(f"--max-files {args.max_files}: give 1 or more.")
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout}: give a number of seconds above 0.")
    diffs = _diffs(args)
    outputs.check(args.out, claim=[f"{name}.{ext}" for name in diffs for ext in ("json", "md")])
    options = upstream.Options(tests=_suites(args.tests, "--tests"), repos=_suites(args.repo, "--repo"),
                               commit=args.commit, max_files=args.max_files, timeout=args.timeout,
                               offline=args.offline, test_pipelines=args.test_pipelines, command=command_line())
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
            progress(f"{name}: {report.status} ({report.reason}); its own test: {report.proof}; ruff: "
                     f"{report.style.status if report.style else 'not run'}; wrote {args.out / name}.json, .md")
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


def _suites(given: list[str], option: str) -> dict[str, Path]:
    """`[PROJECT=]PATH` values by project: a path's project is the one named, else the package its `src/` holds
    (a repository's HEAD, a checkout's folder), else diffusers."""
    from lab.apply import projects, suites

    found: dict[str, Path] = {}
    for value in given:
        name, sep, rest = value.partition("=")
        if sep and name in projects.PROJECTS:
            path = Path(rest).expanduser()
        elif sep and "/" not in name:
            raise unknown_name("project", name, projects.PROJECTS)
        else:
            path = Path(value).expanduser()
            detect = suites.project_of_repo if option == "--repo" else suites.project_of_folder
            name = (detect(path, projects.PROJECTS) if path.exists() else None) or projects.DIFFUSERS.name
        if name in found:
            raise UsageError(f"{option}: two suites of {name} ({found[name]} and {path}); give one.")
        found[name] = path
    return found


def _diffs(args: argparse.Namespace) -> dict[str, Path]:
    """The diffs to check, by fix name: `--fix`'s, or every `*.diff` directly in the `--diffs` folders."""
    folders = args.diffs or list(DIFFS)
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.diff")) if folder.is_dir() else []:
            found.setdefault(path.stem, path)
    where = ", ".join(str(f) for f in folders)
    if args.all:
        if not found:
            raise UsageError(f"--diffs {where}: no diffs (*.diff) there; write them with `lab diff --all --pr --out "
                             f"{folders[0]}`.")
        return found
    if args.fix not in found:
        if not found:
            raise UsageError(f"--diffs {where}: no diffs (*.diff) there.")
        raise unknown_name("PR diff", args.fix, found)
    return {args.fix: found[args.fix]}

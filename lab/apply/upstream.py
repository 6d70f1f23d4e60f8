"""`lab upstream check`: a pull request's diff against its project's own tests (diffusers', accelerate's:
`lab.apply.projects`), run on the release the diff was made from with and without the diff.

For one diff (`patches/pr/<fix>.diff`, `patches/accelerate/<fix>.diff`), whose header names the project, the release
and the diffs it comes after (`# made from diffusers X`, `# made from accelerate X after a.diff, b.diff`):

1. the release's package (its wheel, `releases.find_wheel` + `releases.unpack`) is copied twice into a temporary
   folder, each copy laid out as a checkout (`src/<package>/`, `tests/`, the suite's `pyproject.toml`); the diffs it
   comes after (a series, in the diff's folder) are applied to both, and the diff to one, by `git apply` (its paths,
   `src/<package>/...`, are the checkout's). A diff that does not apply is the check's outcome, with git's reason;
2. the test files of the suite that name a touched module (`lab.apply.suites.select`) are copied into both;
3. pytest runs them in each copy in a process of its own, in its own session (a Ctrl-C or a time limit ends the whole
   run, pytest and what it started), with the copy first on `PYTHONPATH` and diffusers' own conftest putting the
   copy's `src/` first too; the lab's plugin (`check_probe.py`) checks that the run imports the copy and records each
   test's outcome as it ends (a run cut short keeps what it reached);
4. the two runs' outcomes are compared per test id (:func:`compare`);
5. the test files the diff adds (its own regression test, `lab.apply.regression`) are written into the released copy
   too and run in both: they must fail released and pass with the diff (:func:`proof`);
6. `ruff check` and `ruff format --check` of the touched files with the diff, under the suite's ruff configuration
   (`lab.apply.style`): what the diff brings that the released files do not have;
7. with `--test-pipelines`, the second stage: the project's tiny test pipelines of the touched modules
   (`lab.apply.test_pipelines`), built from the suite's `get_dummy_components()` / `get_dummy_inputs()` and run in
   each copy in a process of its own, their outputs compared (bit-identical, or the largest differences).
"""

from __future__ import annotations

import dataclasses
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from lab.apply import projects, regression, releases, style, suites, test_pipelines
from lab.apply.test_run import Run, run_tests
from lab.base.errors import UsageError
from lab.base.files import write_text

#: the project and release a diff was made from, and the diffs it comes after, as its header says (`lab diff --pr`
#: writes `# made from diffusers X: ...`; a series says `# made from accelerate X after a.diff, b.diff: ...`)
MADE_FROM = re.compile(r"^# made from (\w+) (\d\S*?)(?: after ([^:\n]+))?(?::|\s|$)", re.MULTILINE)
#: the copies' names, and the words a report uses for them
ARMS = ("released", "with the diff")
#: how many test pipelines the second stage tries at most, for the `--max-files` that run here
PIPELINES_TRIED = 6
#: what counts as a test that did not pass (a failed call, or an error in its setup or teardown)
BAD = frozenset({"failed", "error"})
#: a test that ran in one copy and not in the other (its file could not be collected, or its run ended first)
NOT_RUN = "not run"


class Outcome(msgspec.Struct, kw_only=True):
    """One test whose outcome differs between the copies (or is bad in both): `before` released, `after` with the
    diff, and the error's last line where one failed (the diff's run first)."""

    id: str
    before: str
    after: str
    message: str = ""


class TestFile(msgspec.Struct, kw_only=True):
    file: str
    mentions: int
    names: list[str]


class Check(msgspec.Struct, kw_only=True):
    """The report of one diff: `status` is `clean` (every test that passed released passes with the diff),
    `regressions`, `does not apply`, `no tests` (no test file of the suite names a touched module) or `could not run`
    (no test passed released: nothing the diff could break was checked), and `reason` says why in words. `proof`
    is what the diff's own tests (`regression_files`, the new test files it adds) showed, run in both copies:
    `proven`, `not proven` or `none` (:func:`proof`); their outcomes are `proof_tests` (`message`: the released
    failure, which says what the change establishes), not the comparison's. `after`: the diffs of the series applied
    to both copies first; `style`: ruff's word on the touched files (:mod:`lab.apply.style`); `pipelines`: the test
    pipelines' outputs compared (`--test-pipelines`, :mod:`lab.apply.test_pipelines`), `pipelines_note` why there are
    none."""

    fix: str
    diff: str
    status: str
    reason: str = ""
    project: str = "diffusers"
    after: list[str] = []
    release: str
    suite: str
    suite_commit: str | None
    suite_ref: str
    suite_note: str = ""
    modules: list[str] = []
    apply_error: str = ""
    test_files: list[TestFile] = []
    candidates: int = 0
    runs: list[Run] = []
    regressions: list[Outcome] = []
    fixed: list[Outcome] = []
    failing_both: list[Outcome] = []
    changed: list[Outcome] = []
    regression_files: list[str] = []
    proof: str = ""
    proof_reason: str = ""
    proof_tests: list[Outcome] = []
    style: style.Style | None = None
    pipelines: list[test_pipelines.Compared] = []
    pipelines_note: str = ""
    missing_packages: list[str] = []
    offline: bool = False
    host: str = ""
    python: str = ""
    torch: str | None = None
    device: str | None = None
    started: str = ""
    seconds: float = 0.0
    command: str = ""


def encode(check: Check) -> str:
    return msgspec.json.format(msgspec.json.encode(check).decode(), indent=2) + "\n"


def decode(text: str | bytes) -> Check:
    return msgspec.json.decode(text, type=Check)


#: the folder, beside the CPU's reports, of the reports a check run on a GPU wrote (`--out patches/checks/gpu`): the
#: tests that skip without an accelerator ran there
ON_GPU = "gpu"


def committed(checks: Path, name: str) -> list[tuple[Path, Check]]:
    """The committed reports of diff `name`: the CPU's (`<checks>/<name>.json`), then the GPU's where one was run
    (`<checks>/gpu/<name>.json`); one that is missing or cannot be read is left out."""
    found = []
    for path in (checks / f"{name}.json", checks / ON_GPU / f"{name}.json"):
        try:
            found.append((path, decode(path.read_bytes())))
        except (OSError, ValueError, msgspec.ValidationError):
            continue
    return found


def proving(reports: Sequence[Check]) -> Check | None:
    """The report whose run of the diff's own test says most: the first that proves it, else the first that ran it,
    else the first (a test that skips on the CPU is proven on the GPU)."""
    return (next((c for c in reports if c.proof == "proven"), None)
            or next((c for c in reports if c.proof not in ("", "not run here")), None)
            or (reports[0] if reports else None))


# --- the diff ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MadeFrom:
    """What a diff's header says: the project, its release, and the diffs (file names beside it) it comes after."""

    project: str
    version: str
    after: tuple[str, ...] = ()


def made_from(diff: str, name: str) -> MadeFrom:
    """The project and release a diff was made from and the diffs it comes after (its `# made from PROJECT X [after
    a.diff, b.diff]` header); a one-line error where there is none or it names an unknown project."""
    match = MADE_FROM.search(diff)
    if not match:
        raise UsageError(f"{name} has no `# made from diffusers X` header: write it with `lab diff --pr`, or add the "
                         "line naming the project and release it applies to.")
    project = projects.project(match[1]).name
    return MadeFrom(project, match[2], tuple(re.findall(r"[\w.-]+\.diff", match[3] or "")))


def release_of(diff: str, name: str) -> str:
    """The release a diff was made from (its `# made from PROJECT X` header)."""
    return made_from(diff, name).version


def apply(diff: Path, checkout: Path) -> str:
    """`git apply` of `diff` in the checkout-shaped folder `checkout` (a repository of its own, so that git reads the
    paths from there whatever folder holds it); "" when it applied, else git's reason. All or nothing: git changes
    no file of a diff that does not apply."""
    subprocess.run(["git", "init", "-q", str(checkout)], check=True, capture_output=True)
    done = subprocess.run(["git", "-C", str(checkout), "apply", "--whitespace=nowarn", str(diff.resolve())],
                          check=False, capture_output=True, text=True)
    if done.returncode == 0:
        return ""
    return " ".join(done.stderr.split())[:1000] or f"git apply exited {done.returncode}"


def metadata(src: Path, package: str, version: str) -> None:
    """The package's metadata beside its copy in `src` (`<package>-<version>.dist-info/METADATA`), as an editable
    install of a checkout has it: tests read the version through `importlib.metadata`, which finds the copy first on
    the run's path."""
    write_text(src / f"{package}-{version}.dist-info" / "METADATA",
               f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")


def _copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"), symlinks=True)


# --- the comparison ----------------------------------------------------------------------------------------------


def compare(before: dict[str, dict], after: dict[str, dict]) -> dict[str, list[Outcome]]:
    """Each test's outcome released (`before`) against with the diff (`after`), by test id; a test absent from a run
    is `not run` there. Regressions: passed released, and failed, errored or did not run with the diff; or did not
    pass released nor fail there, and failed with the diff (a file the diff keeps from being collected). Fixed:
    failed or errored released, passed with the diff. Failing both: bad in both. Changed: any other difference.
    Pure."""
    found: dict[str, list[Outcome]] = {"regressions": [], "fixed": [], "failing_both": [], "changed": []}
    for test in sorted(before.keys() | after.keys()):
        b = before.get(test, {"outcome": NOT_RUN, "message": ""})
        a = after.get(test, {"outcome": NOT_RUN, "message": ""})
        message = a["message"] or b["message"]
        outcome = Outcome(id=test, before=b["outcome"], after=a["outcome"], message=message)
        if b["outcome"] == "passed" and (a["outcome"] in BAD or a["outcome"] == NOT_RUN) or (
                b["outcome"] not in BAD and a["outcome"] in BAD):
            found["regressions"].append(outcome)
        elif b["outcome"] in BAD and a["outcome"] == "passed":
            found["fixed"].append(outcome)
        elif b["outcome"] in BAD and a["outcome"] in BAD:
            found["failing_both"].append(outcome)
        elif b["outcome"] != a["outcome"]:
            found["changed"].append(outcome)
    return found


# --- the check ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """What a check needs beside the diff: each project's suite (a folder, or a repository and a revision), how many
    test files run per diff, each run's time limit, whether the test pipelines' stage runs, and the command line to
    record."""

    tests: dict[str, Path] = dataclasses.field(default_factory=dict)
    repos: dict[str, Path] = dataclasses.field(default_factory=dict)
    commit: str | None = None
    max_files: int = 4
    timeout: float = 900.0
    offline: bool = False
    test_pipelines: bool = False
    command: str = ""


def suite_for(options: Options, project: str, version: str) -> suites.Suite:
    """The suite of `project`'s release `version`: its `--tests` folder, else its `--repo` at `--commit` or the tag."""
    if project in options.tests:
        return suites.from_folder(options.tests[project])
    if project in options.repos:
        return suites.from_repo(options.repos[project], version, options.commit)
    raise UsageError(f"no test suite of {project} given: add --repo PATH ({project}'s git repository) or --tests "
                     f"PATH (a {project} checkout).")


def _config(suite: suites.Suite, project: str) -> tuple[str, str]:
    """The ruff configuration the style step uses, and where it is from: the suite's `pyproject.toml`, else
    diffusers' own as the lab holds it."""
    path = suite.root / "pyproject.toml"
    if path.is_file():
        where = f"{projects.project(project).possessive} pyproject.toml at {suite.ref}"
        return path.read_text(encoding="utf-8"), where
    if project == projects.DIFFUSERS.name:
        return style.DIFFUSERS_RUFF, "diffusers' pyproject.toml as the lab holds it (lab.apply.style)"
    return "", f"ruff's defaults ({suite.ref} has no pyproject.toml)"


def check(name: str, diff: Path, options: Options, say: Callable[[str], None] = print) -> Check:
    """The check of one diff (the module docstring's steps); `say` takes the progress lines."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clock = time.perf_counter()
    text = diff.read_text(encoding="utf-8")
    made = made_from(text, str(diff))
    project, version = projects.project(made.project), made.version
    before = [diff.parent / n for n in made.after]
    for path in before:
        if not path.is_file():
            raise UsageError(f"{diff} comes after {path.name}, which is not in {diff.parent}.")
    suite = suite_for(options, project.name, version)
    site = releases.unpack(releases.find_wheel(version, package=project.name), project.name)
    paths = suites.touched_paths(text, project.name)
    report = Check(fix=name, diff=str(diff), status="", project=project.name, after=list(made.after), release=version,
                   suite=str(suite.root), suite_commit=suite.commit, suite_ref=suite.ref, suite_note=suite.note,
                   modules=paths, offline=options.offline, host=platform.node(), python=platform.python_version(),
                   started=started, command=options.command)
    say(f"{name}: {project.name} {version}" + (f" after {', '.join(made.after)}" if made.after else "")
        + f", tests of {suite.ref}" + (f" ({suite.note})" if suite.note else ""))
    carried = {p: t for p, t in regression.added_files(text).items() if _is_test(p)}
    report.regression_files = list(carried)
    config, config_from = _config(suite, project.name)
    with tempfile.TemporaryDirectory(prefix=f"lab-check-{name}-") as folder:
        folder = Path(folder)
        checkouts = {arm: folder / arm.replace(" ", "-") for arm in ARMS}
        for checkout in checkouts.values():
            _copy(site / project.name, checkout / "src" / project.name)
            metadata(checkout / "src", project.name, version)
            _copy(suite.root / "tests", checkout / "tests")
            for path in before:  # the series the diff comes after: in both copies
                error = apply(path, checkout)
                if error:
                    report.apply_error = f"{path.name}, which it comes after: {error}"
                    break
        if not report.apply_error:
            report.apply_error = apply(diff, checkouts[ARMS[1]])
        if report.apply_error:
            say(f"{name}: the diff does not apply to {project.name} {version}: {report.apply_error}")
            report.reason = f"`git apply` in {project.name} {version}: {report.apply_error}"
            return _done(report, "does not apply", clock)
        for path, test in carried.items():  # the released copy runs the diff's own tests without the change
            (checkouts[ARMS[0]] / path).parent.mkdir(parents=True, exist_ok=True)
            (checkouts[ARMS[0]] / path).write_text(test, encoding="utf-8")
        report.style = style.check_files(checkouts[ARMS[0]], checkouts[ARMS[1]],
                                         [f"src/{p}" for p in paths] + list(carried), config, config_from,
                                         new=list(carried))
        say(f"{name}: ruff: {report.style.status} ({report.style.reason})")
        chosen = _choose(report, suite, checkouts, paths, options.max_files)
        if not chosen and not carried:
            say(f"{name}: {report.reason}; the diff carries no test of its own")
            return _done(report, "no tests", clock)
        say(f"{name}: {len(chosen)} of {report.candidates} test files that name the touched modules"
            + "".join(f", {file}" for file in chosen) + "".join(f"; its own: {p}" for p in carried))
        outcomes = {}
        for arm, checkout in checkouts.items():
            say(f"{name}: running them {arm} (time limit {options.timeout:g} s)")
            run, outcomes[arm] = run_tests(checkout, chosen + list(carried), options.timeout, arm,
                                           folder / f"{checkout.name}.log", options.offline, project.name)
            report.runs.append(run)
            say(f"{name}: {arm}: {_counted(run)} in {run.seconds:.0f} s"
                + (f"; {run.could_not_run}" if run.could_not_run else ""))
        if options.test_pipelines:
            _pipelines(report, project, suite, checkouts, paths, options, folder, say)
    released, changed = _prove(report, outcomes[ARMS[0]], outcomes[ARMS[1]], list(carried))
    if carried:
        say(f"{name}: its own test: {report.proof} ({report.proof_reason})")
    report.missing_packages = sorted({m for r in report.runs for m in r.missing_modules})
    ran = [r for r in report.runs if r.torch]
    report.torch, report.device = (ran[0].torch, ran[0].device) if ran else (None, None)
    if not chosen:
        return _done(report, "no tests", clock)
    return _done(report, _conclude(report, released, changed), clock)


def _pipelines(report: Check, project: projects.Project, suite: suites.Suite, checkouts: dict[str, Path],
               paths: list[str], options: Options, folder: Path, say: Callable[[str], None]) -> None:
    """The second stage: the test pipelines of the touched modules, run in both copies and compared."""
    if not project.pipelines:
        report.pipelines_note = f"{project.name}'s suite has no test pipelines"
        return
    sources = {p: _read(checkouts[ARMS[1]] / "src" / p) or _read(checkouts[ARMS[0]] / "src" / p) for p in paths}
    found = test_pipelines.select(suite.root, [suites.module(p, s) for p, s in sources.items()])
    if not found:
        report.pipelines_note = "no test pipeline of the suite is built from a touched module"
        say(f"{report.fix}: test pipelines: none built from a touched module")
        return
    # a test pipeline that needs what is not here fails at once: the next ones are tried, up to a few
    tried = found[:max(options.max_files, PIPELINES_TRIED)]
    say(f"{report.fix}: test pipelines: trying " + ", ".join(c.label for c in tried))
    compared = test_pipelines.compare_runs(tried, checkouts[ARMS[0]], checkouts[ARMS[1]], folder, options.timeout,
                                           options.offline, project.name)
    ran = [c for c in compared if c.status != test_pipelines.NOT_RUN]
    report.pipelines = ran[:options.max_files] or compared[:options.max_files]
    failed = len(compared) - len(ran)
    report.pipelines_note = (f"{len(report.pipelines)} of the {len(found)} test pipelines built from a touched module"
                             f" shown; {len(tried)} tried, {failed} could not run here" if len(found) > 1 or failed
                             else "")
    for c in report.pipelines:
        say(f"{report.fix}: test pipeline {c.test}: {c.status}" + (f" ({c.reason})" if c.reason else ""))


def _choose(report: Check, suite: suites.Suite, checkouts: dict[str, Path], paths: list[str], most: int) -> list[str]:
    """The suite's test files that name the touched modules (at most `most`), recorded in the report; where there are
    none, the report's reason says so."""
    sources = {p: _read(checkouts[ARMS[0]] / "src" / p) or _read(checkouts[ARMS[1]] / "src" / p) for p in paths}
    matches = suites.select(suite.root, [suites.module(p, s) for p, s in sources.items()])
    report.candidates = len(matches)
    chosen = matches[:most]
    report.test_files = [TestFile(file=m.file, mentions=m.mentions, names=list(m.names)) for m in chosen]
    if not chosen:
        report.reason = f"no test file of the suite names {', '.join(paths) or 'a module of diffusers'}"
    return [m.file for m in chosen]


def _prove(report: Check, before: dict[str, dict], after: dict[str, dict],
           carried: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """The diff's own tests' outcomes into the report (`proof`, `proof_tests`); the suite's outcomes, without them."""
    own = [{t: o for t, o in found.items() if _in_files(t, carried)} for found in (before, after)]
    missing = {"outcome": NOT_RUN, "message": ""}
    report.proof_tests = [Outcome(id=t, before=own[0].get(t, missing)["outcome"],
                                  after=own[1].get(t, missing)["outcome"], message=own[0].get(t, missing)["message"])
                          for t in sorted(own[0].keys() | own[1].keys())]
    report.proof, report.proof_reason = proof(own[0], own[1], carried)
    return ({t: o for t, o in before.items() if t not in own[0]}, {t: o for t, o in after.items() if t not in own[1]})


def _conclude(report: Check, before: dict[str, dict], after: dict[str, dict]) -> str:
    """The comparison of the suite's outcomes into the report, and the status it gives (the reason in the report)."""
    for key, found in compare(before, after).items():
        setattr(report, key, found)
    if report.regressions:
        status = "regressions"
        n = len(report.regressions)
        reason = f"{n} test{'s pass' if n > 1 else ' passes'} released and not with the diff"
    elif not any(t["outcome"] == "passed" for t in before.values()):
        status = "could not run"
        released = report.runs[0]
        reason = "no test passed released: " + (released.could_not_run or _counted(released))
        if report.missing_packages:
            reason += f"; missing here: {', '.join(report.missing_packages)}"
    else:
        status = "clean"
        n = sum(t["outcome"] == "passed" for t in before.values())
        reason = f"all {n} tests that pass released pass with the diff" if n > 1 else \
            "the one test that passes released passes with the diff"
    if report.failing_both and status != "could not run":
        reason += f"; {len(report.failing_both)} fail either way"
    report.reason = reason
    return status


def proof(before: dict[str, dict], after: dict[str, dict], files: Sequence[str]) -> tuple[str, str]:
    """Whether the diff's own tests (`files`) prove the change: none of their tests fails with the diff and at least
    one fails released and passes with it (`proven`, naming those that skip here); `not run here` where the ones that
    could prove it skip here (a test that needs an accelerator, on the CPU); else `not proven`, or `none` where the
    diff carries no test. Pure."""
    if not files:
        return "none", "the diff carries no test of its own"
    if not after:
        return "not proven", f"none of its tests ran with the diff ({', '.join(files)})"
    failing = sorted(t for t, o in after.items() if o["outcome"] not in ("passed", "skipped"))
    skipped = sorted(t for t, o in after.items() if o["outcome"] == "skipped")
    why = sorted({after[t]["message"] for t in skipped})
    if failing:
        return "not proven", (f"{len(failing)} of its {len(after)} tests do not pass with the diff: "
                              f"{', '.join(failing)}")
    def passes(test: str) -> bool:  # with the diff; a file that could not be collected released: its tests
        if test in after:
            return after[test]["outcome"] == "passed"
        return "::" not in test and any(t.startswith(f"{test}::") for t in after)

    caught = sorted(t for t, o in before.items() if o["outcome"] in BAD and passes(t))
    if not caught and skipped:
        return "not run here", (f"{len(skipped)} of its {len(after)} tests skip here ({'; '.join(why)}); "
                                + ("the others pass released too" if len(skipped) < len(after) else "none ran"))
    if not caught:
        return "not proven", f"its {len(after)} tests pass released too: none fails without the change"
    ran = len(after) - len(skipped)
    text = (f"{len(caught)} of its {len(after)} tests fail released and pass with the diff" if len(after) > 1
            else "its test fails released and passes with the diff")
    if skipped:
        text += f"; {len(skipped)} skip here ({'; '.join(why)})"
    elif ran > len(caught):
        text += f"; the other {ran - len(caught)} pass either way"
    return "proven", text


def _is_test(path: str) -> bool:
    return path.startswith("tests/") and Path(path).name.startswith("test_") and path.endswith(".py")


def _in_files(test: str, files: Sequence[str]) -> bool:
    return test.split("::", 1)[0] in files


def _counted(run: Run) -> str:
    return ", ".join(f"{n} {k}" for k, n in run.counts.items() if n) or "no test collected"


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _done(report: Check, status: str, clock: float) -> Check:
    report.status = status
    report.seconds = round(time.perf_counter() - clock, 1)
    return report

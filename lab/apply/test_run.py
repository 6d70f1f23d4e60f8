"""One run of a project's own tests for `lab upstream check`: pytest over the chosen files in one copy, in a process and
session of its own, with `check_probe` loaded, and the run's summary and each test's outcome read back from what the
probe wrote (a run its time limit ends keeps what it finished).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from lab.apply import projects

#: the order in which one test's phases decide its outcome: the worst phase wins
WORST = ("passed", "xfailed", "skipped", "xpassed", "failed", "error")


class FileError(msgspec.Struct, kw_only=True):
    file: str
    message: str


class Run(msgspec.Struct, kw_only=True):
    """One run of the tests in one copy: its counts by outcome, the files pytest could not collect, the reasons tests
    were skipped (on the CPU, those that need an accelerator), what stopped the run as a whole (`could_not_run`: the time limit, a conftest that failed, the wrong diffusers imported), and what
    ran: the diffusers it imported, torch and the device."""

    arm: str
    returncode: int | None
    seconds: float
    counts: dict[str, int]
    collection_errors: list[FileError] = []
    skipped_because: dict[str, int] = {}
    missing_modules: list[str] = []
    could_not_run: str | None = None
    log_tail: str = ""
    diffusers: str | None = None
    torch: str | None = None
    device: str | None = None
    #: a test's id -> torch's device functions it replaced and left replaced, put back after it (`check_probe`)
    restored: dict[str, list[str]] = {}


# --- one run of the tests ----------------------------------------------------------------------------------------


def run_tests(checkout: Path, files: Sequence[str], timeout: float, arm: str, log: Path,
              offline: bool = False, package: str = "diffusers") -> tuple[Run, dict[str, dict]]:
    """pytest over `files` in `checkout` (a folder holding `src/<package>` and `tests/`) in a process of its own: the
    run's summary and each test's outcome by id (`{"outcome", "message"}`). A run its time limit ends keeps the
    outcomes of the tests it finished. `offline`: the Hub is not asked (`HF_HUB_OFFLINE=1`), so that a test that
    downloads fails at once where the Hub cannot be reached, instead of after the Hub client's retries."""
    probe = log.with_suffix(".probe.jsonl")
    plugins = log.parent / "plugins"
    plugins.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).with_name("check_probe.py"), plugins / "lab_check_probe.py")
    (checkout / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no ini file of a folder above applies
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # its own session, not the caller's
    env["PYTHONPATH"] = os.pathsep.join([str(checkout / "src"), str(plugins), *filter(None, [env.get("PYTHONPATH")])])
    # diffusers' tests start `python` by name: it must be this interpreter (a virtual environment's, not activated)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), *filter(None, [env.get("PATH")])])
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    env.update(LAB_CHECK_SITE=str(checkout / "src"), LAB_CHECK_PROBE=str(probe), LAB_CHECK_PACKAGE=package,
               PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-p", "lab_check_probe", "-p", "no:cacheprovider", "-q",
               "--continue-on-collection-errors", "--rootdir", str(checkout), *files]
    start = time.perf_counter()
    stopped = None
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            code, stopped = None, f"stopped at its time limit, {timeout:g} s"
        except BaseException:  # a Ctrl-C or a time limit's SIGTERM: the run and what it started end with the lab
            _end(proc)
            raise
    seconds = time.perf_counter() - start
    return _summary(arm, code, seconds, stopped, probe, log)


def _end(proc: subprocess.Popen) -> None:
    """End a run's whole session (pytest and every process it started)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


def _summary(arm: str, code: int | None, seconds: float, stopped: str | None, probe: Path,
             log: Path) -> tuple[Run, dict[str, dict]]:
    records = []
    if probe.exists():
        for line in probe.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut off where the run was ended
                continue
    tests: dict[str, dict] = {}
    collect, missing = [], set()
    restored: dict[str, list[str]] = {}
    session = next((r for r in records if r["kind"] == "session"), None)
    finish = next((r for r in records if r["kind"] == "finish"), None)
    for r in records:
        missing.update(m.split(".")[0] for m in r.get("missing", ()))
        if r["kind"] == "collect":
            collect.append(FileError(file=r["file"], message=r["message"]))
        elif r["kind"] == "restored":
            restored[r["id"]] = r["names"]
        elif r["kind"] == "test":
            seen = tests.get(r["id"])
            if seen is None or WORST.index(r["outcome"]) > WORST.index(seen["outcome"]):
                tests[r["id"]] = {"outcome": r["outcome"], "message": r.get("message", "")}
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    if session is None:  # the run stopped before the plugin could record (a conftest that failed): its output says
        missing.update(m.split(".")[0] for m in re.findall(r"No module named '([\w.]+)'", text))
    missing -= {*projects.PROJECTS, "tests"}  # a module of another release than the suite's: not a package to install
    tail = "\n".join(text.strip().splitlines()[-15:])
    problem = stopped
    if problem is None and session is not None and not session["ok"]:
        package = session.get("package", "diffusers")
        problem = (f"the run imported {package} from {session['diffusers']}, not the copy under test"
                   if session["diffusers"] else f"`import {package}` failed: {session.get('error')}")
    if problem is None and session is None:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"pytest exited {code}"]
        problem = f"pytest stopped before its first test (exit code {code}): {last[0].strip()[:300]}"
    if problem is None and code not in (0, 1, 5):  # 1: some failed, 5: nothing collected
        problem = f"pytest exited {code}"
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    for t in tests.values():
        counts[t["outcome"]] += 1
    counts["collection errors"] = len(collect)
    because: dict[str, int] = {}
    for t in tests.values():
        if t["outcome"] == "skipped":
            because[t["message"]] = because.get(t["message"], 0) + 1
    run = Run(arm=arm, returncode=code, seconds=round(seconds, 1), counts=counts, collection_errors=collect,
              skipped_because=dict(sorted(because.items(), key=lambda kv: (-kv[1], kv[0]))),
              missing_modules=sorted(missing), could_not_run=problem, log_tail=tail if problem or collect else "",
              diffusers=session and session.get("diffusers"), torch=finish and finish.get("torch"),
              device=finish and finish.get("device"), restored=restored)
    for f in collect:  # a file that could not be collected: one test id, so that one broken by the diff shows
        tests[f.file] = {"outcome": "error", "message": f.message}
    return run, tests

"""A pytest plugin that `lab upstream check` loads into each run of diffusers' tests (`-p lab_check_probe`); the lab
never imports it: it is copied beside the run as `lab_check_probe.py`, so that the run imports nothing of the lab.

It writes one JSON line per event to `$LAB_CHECK_PROBE`, as each one happens, so that a run its time limit cuts
short (or whose conftest fails) keeps what it reached:

- `session`: the package under test the run imports (`$LAB_CHECK_PACKAGE`, diffusers unless named: its `__file__`,
  `__version__`); one outside `$LAB_CHECK_SITE` (the copy under test) ends the run at its start, since its outcomes
  would be another copy's;
- `collect`: a test file that could not be collected, with its error;
- `test`: one phase of one test (setup, call, teardown): its node id, outcome and the error's last line;
- `restored`: a public function of torch's device modules (`GUARDED`) that a test replaced and did not put back,
  put back after the test's call: upstream tests patch `torch.cuda.is_available` by assignment, and one that fails
  before its own restore would leave every later test of the run (their set-up and tear-down, which reset CUDA's
  memory statistics) on a CUDA that reports itself absent, failing for a reason that is neither copy's;
- `finish`: torch's version and the device the tests ran on (CUDA where torch found a GPU).

A record of an error carries the modules it names as missing (`No module named 'x'`): the packages diffusers' tests
need that are not installed here.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

MISSING = re.compile(r"No module named '([\w.]+)'")
#: torch's device modules whose public functions each test's call must leave as it found them
GUARDED = ("torch.cuda", "torch.xpu", "torch.mps", "torch.accelerator", "torch.backends.mps")


def _write(record: dict) -> None:
    with open(os.environ["LAB_CHECK_PROBE"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _error(report) -> tuple[str, list[str]]:
    """The line that says what went wrong (the first of pytest's crash message: the exception, else its last `E   ...`
    line), and the missing modules the whole text names."""
    text = getattr(report, "longreprtext", "") or ""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ") and line[1:].strip()]
    crash = (getattr(getattr(report.longrepr, "reprcrash", None), "message", None) or "").strip().splitlines()
    message = crash[0] if crash else lines[-1] if lines else (text.strip().splitlines() or [""])[-1]
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        message = str(report.longrepr[2]).removeprefix("Skipped: ")
    return message[:500], sorted(set(MISSING.findall(text)))


def pytest_sessionstart(session) -> None:
    site = Path(os.environ["LAB_CHECK_SITE"]).resolve()
    name = os.environ.get("LAB_CHECK_PACKAGE", "diffusers")
    try:
        package = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - the copy under test does not import: every test of this run cannot run
        _write({"kind": "session", "ok": False, "package": name, "diffusers": None,
                "error": f"{type(e).__name__}: {e}"[:500], "missing": MISSING.findall(str(e))})
        pytest.exit(f"import {name} failed: {type(e).__name__}: {e}", returncode=3)
    where = Path(package.__file__).resolve()
    ok = where.is_relative_to(site)
    # the key `diffusers` holds the imported package's path whichever it is (the reports' field)
    _write({"kind": "session", "ok": ok, "package": name, "diffusers": str(where),
            "version": getattr(package, "__version__", None)})
    if not ok:
        pytest.exit(f"the run imports {name} from {where}, not from the copy under test in {site}", returncode=3)


def _guarded() -> dict[str, dict[str, object]]:
    """The public functions of each imported module of `GUARDED`, by module and name (no import: an unused backend
    stays unloaded)."""
    return {name: {k: v for k, v in vars(sys.modules[name]).items() if not k.startswith("_") and callable(v)}
            for name in GUARDED if name in sys.modules}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before = _guarded()
    yield
    restored = []
    for name, functions in before.items():
        module = sys.modules[name]
        for key, value in functions.items():
            if getattr(module, key, None) is not value:
                setattr(module, key, value)
                restored.append(f"{name}.{key}")
    if restored:
        _write({"kind": "restored", "id": item.nodeid, "names": restored})


def pytest_collectreport(report) -> None:
    if report.failed:
        message, missing = _error(report)
        _write({"kind": "collect", "file": report.nodeid, "message": message, "missing": missing})


def pytest_runtest_logreport(report) -> None:
    outcome = report.outcome
    if report.when in ("setup", "teardown") and report.failed:
        outcome = "error"
    elif hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    record = {"kind": "test", "id": report.nodeid, "when": report.when, "outcome": outcome}
    if report.failed or report.skipped:
        record["message"], record["missing"] = _error(report)
    if report.when == "call" or report.failed or report.skipped:
        _write(record)


def pytest_sessionfinish(session, exitstatus) -> None:
    torch = sys.modules.get("torch")
    device = "cpu"
    if torch is not None:
        try:
            if torch.cuda.is_available():
                device = f"cuda ({torch.cuda.get_device_name(0)})"
        except Exception:  # noqa: BLE001, S110 - a broken CUDA set-up: the tests ran on the CPU
            pass
        version = str(torch.__version__)
    else:
        try:
            from importlib.metadata import version as installed

            version = installed("torch")
        except Exception:  # noqa: BLE001 - no torch here: the report says n/a
            version = None
    _write({"kind": "finish", "exitstatus": int(exitstatus), "torch": version, "device": device})

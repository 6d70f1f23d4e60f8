"""Shared test helpers: upstream diffusers releases (fetched once from PyPI into .cache/) and the test data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
DATA = ROOT / "tests" / "data"
PINNED = re.search(r'"diffusers==([^"]+)"', (ROOT / "pyproject.toml").read_text())[1]
# Releases the tests need come through the lab's own `lab.apply.releases`, cached in .cache/ (the lab's subprocesses in
# the tests inherit these).
os.environ.setdefault("LAB_CACHE", str(CACHE / "lab"))
os.environ.setdefault("LAB_WHEELS", str(CACHE / "wheels"))
# One intra-op thread for torch, here and in the lab's subprocesses: the suite runs one worker per core, and torch's
# own threads on top of them would oversubscribe the cores (no test times anything; the tiny models gain nothing).
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


def pytest_configure(config):
    """The tests compare against the diffusers that pyproject.toml pins (rewrites, committed patches, 0.38.0 ASTs);
    other releases are tested through their own unpacked wheels. Another installed diffusers is a setup error, said
    once, rather than tests that quietly skip."""
    from lab.apply.versions import diffusers_version

    found = str(diffusers_version())
    if found != PINNED:
        pytest.exit(f"the tests need diffusers {PINNED} (pinned in pyproject.toml), found {found}: run `make test`, "
                    "which installs the pinned environment into .venv", returncode=4)


def lab(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """`python -m lab.cli ARGS` as a user runs it (from the repository root unless `cwd` says otherwise), its output
    captured as text."""
    kwargs.setdefault("cwd", ROOT)
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, **kwargs)


def lab_here(*args: str) -> subprocess.CompletedProcess:
    """`lab ARGS` in this process (`lab.cli.main`), its output captured as text, without the seconds (about 9 here) a
    fresh interpreter spends importing torch and diffusers: for usage errors and refusals, and for whole runs whose
    test is not about the process itself (the lab leaves no patch, hook or setting behind; `test_reversibility`).
    What only a separate process shows (its signals, what reaches the user's terminal from processes it starts)
    takes `lab` or `lab_forked`."""
    import contextlib
    import io

    from lab import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["lab", *args], code, out.getvalue(), err.getvalue())


_SERIES = """
import json, os, sys, tempfile
from lab import cli
done = []
for args in json.loads(sys.argv[2]):
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush(); sys.stderr.flush()
    kept = os.dup(1), os.dup(2)
    os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    try:
        code = cli.main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(kept[0], 1); os.dup2(kept[1], 2)
    text = []
    for f in (out, err):
        f.seek(0)
        text.append(f.read().decode(errors="replace"))
    done.append([code, *text])
with open(sys.argv[1], "w") as f:
    json.dump(done, f)
"""


def lab_series(*commands: list[str], env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Several `lab` commands one after another in one fresh interpreter (`lab.cli.main` each, its file descriptors 1
    and 2 captured apart): for commands that need a process of their own (another diffusers on `PYTHONPATH`) but
    not one each, which would import torch and diffusers again for each. A command that left a patch or a hook
    behind would show in the next (the lab leaves none: `test_reversibility`)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        answer = Path(folder) / "series.json"
        proc = subprocess.run([sys.executable, "-c", _SERIES, str(answer), json.dumps([list(c) for c in commands])],
                              cwd=ROOT, capture_output=True, text=True, env=env)
        assert proc.returncode == 0 and answer.exists(), proc.stderr[-3000:]
        done = json.loads(answer.read_text())
    return [subprocess.CompletedProcess(["lab", *c], code, out, err) for c, (code, out, err) in zip(commands, done)]


class Forked:
    """A `lab` process started by `lab_forked`: its process id (its own process group's too), its stderr (text, as
    `subprocess.Popen(..., stderr=PIPE, text=True)` gives it), and the few `Popen` calls the tests make."""

    def __init__(self, pid: int, stderr) -> None:
        self.pid, self.stderr, self.returncode = pid, stderr, None

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(["lab"], timeout)
            time.sleep(0.05)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        err = self.stderr.read()  # to its end: the process (and any job that shares its stderr) has exited
        self.stderr.close()
        self.wait(timeout)
        return None, err


def lab_forked(*args: str, cwd: Path = ROOT) -> Forked:
    """`lab ARGS` in a process of its own, in a session (and process group) of its own as `start_new_session` gives,
    for what a test does to a running lab from outside: its signals, a SIGKILL. The process is forked from this one,
    so it starts with what this one imported (torch, diffusers) rather than spending a fresh interpreter's seconds
    importing them; it runs `lab.cli.main` as `python -m lab.cli` does, with `sys.argv` its command line. Its stdout
    goes nowhere; its stderr comes back through `.stderr`. Only for a lab that computes nothing with torch itself (a
    campaign, whose jobs are fresh processes; a census handed on to a process that imports another diffusers):
    torch's OpenMP threads do not survive a fork. Nor for a campaign on a local Dask cluster once this process has
    run one (`lab_here(... "--workers" ...)`): forked after that, its cluster never started its jobs."""
    import lab.apply.fix  # noqa: F401 - imported here once, not in each forked process
    import lab.run.scenario  # noqa: F401
    from lab import cli

    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.setsid()
            os.chdir(cwd)
            os.close(read)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(write, 2)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            sys.argv = [str(ROOT / "lab" / "cli.py"), *args]
            code = cli.main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    return Forked(pid, os.fdopen(read, "r"))


def diffusers_release(version: str) -> Path:
    """An unpacked diffusers wheel (`<dir>/diffusers/...`), downloaded from PyPI once and cached in .cache/."""
    from lab.apply import releases

    return releases.unpack(releases.find_wheel(version))


def upstream_source(version: str, module: str) -> str:
    path = diffusers_release(version) / (module.replace(".", "/") + ".py")
    return path.read_text()


@pytest.fixture(scope="session")
def real_trace() -> Path:
    """A real torch.profiler trace of Wan on an H200 (compiled, no fixes; `tests/data/traces/README.md`)."""
    return DATA / "traces" / "wan_base_compile.json.gz"


def ctrl_c_at(monkeypatch, n: int):
    """Make the `n`-th timed call of `lab.measure.ab` raise KeyboardInterrupt (a Ctrl-C mid-run); returns the real call."""
    from lab.measure import ab

    calls = {"n": 0}
    real = ab.timed_call

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ab, "timed_call", interrupted)
    return real


def marked_diffusers_copy(folder: Path) -> tuple[Path, str]:
    """A copy of the installed diffusers as a site-packages folder under `folder`, its version marked (`0.37.1.post7`):
    a diffusers other than the installed one that needs no download. Returns the folder and the marked version."""
    import shutil

    import diffusers

    site = folder / "site"
    shutil.copytree(Path(diffusers.__file__).parent, site / "diffusers", ignore=shutil.ignore_patterns("__pycache__"))
    init = site / "diffusers" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{diffusers.__version__}"',
                                             f'__version__ = "{diffusers.__version__}.post7"'))
    return site, f"{diffusers.__version__}.post7"


def drawn(path: Path) -> bool:
    """Whether `path` is a plot with something drawn on it: a PNG canvas of some size in more than a few colours (a
    plot's bytes say little: its palette PNG holds an effects plot of one result in 9 KB)."""
    from PIL import Image

    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(1 << 16)
        return image.format == "PNG" and min(image.size) >= 200 and (colours is None or len(colours) > 8)

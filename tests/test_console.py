"""What pipelines print goes to a log; the lab's progress and results stay on the terminal."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = """
import os, sys
from pathlib import Path
from lab.base import console
log = Path(sys.argv[1])
with console.captured(log):
    os.write(2, b"USDT: from C++\\n")          # what the profiler prints below Python
    print("50%|#####     | 2/4", file=sys.stderr)  # a progress bar
    console.progress("block 3/40")
    console.progress("\\rtransient status")    # a plain line when not on a terminal
    print("the verdict")
    raise_here = len(sys.argv) > 2
    if raise_here:
        raise SystemExit(3)
print("after", file=sys.stderr)
"""


def run(*args):
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, cwd=ROOT)


def test_pipeline_output_goes_to_the_log_and_progress_to_the_terminal(tmp_path):
    log = tmp_path / "x.log"
    proc = run(str(log))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "block 3/40\ntransient status\nafter\n" and proc.stdout == "the verdict\n"
    assert log.read_text() == "USDT: from C++\n50%|#####     | 2/4\n"


def test_the_terminal_comes_back_after_an_error(tmp_path):
    proc = run(str(tmp_path / "x.log"), "raise")
    assert proc.returncode == 3 and proc.stderr == "block 3/40\ntransient status\n"


INTERRUPTED = """
import os, signal, sys
from pathlib import Path
from lab.base import console, errors
errors.take_interruptions()
where = sys.argv[2]
calls = {"fdopen": 0, "close": 0}
real_fdopen, real_close = os.fdopen, os.close
def fdopen(*args, **kwargs):  # a time limit's SIGTERM halfway through the swap
    calls["fdopen"] += 1
    if where == "swap" and calls["fdopen"] == 1:
        signal.raise_signal(signal.SIGTERM)
    return real_fdopen(*args, **kwargs)
def close(fd):  # the same halfway through the restore
    calls["close"] += 1
    if where == "restore" and calls["close"] == 1:
        signal.raise_signal(signal.SIGTERM)
    return real_close(fd)
os.fdopen, os.close = fdopen, close
try:
    with console.captured(Path(sys.argv[1])):
        print("the body ran", file=sys.stderr)
except KeyboardInterrupt as e:
    print(f"interrupted: {type(e).__name__}", file=sys.stderr)
os.write(2, b"fd 2 is the terminal again\\n")
print("after", file=sys.stderr)
print("stdout works")
"""


@pytest.mark.parametrize("where", ["swap", "restore"])
def test_an_interruption_while_the_streams_are_swapped_waits_until_the_swap_is_whole(tmp_path, where):
    """A time limit's SIGTERM that came while the streams were being swapped once closed the terminal's own stderr
    (the lab then exited 1 with nothing said, its result kept but its exit code wrong). Now it is delivered when the
    swap (or the restore) is whole: the body does not run if it came during the swap, and either way the terminal's
    streams are back and open."""
    log = tmp_path / "x.log"
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED, str(log), where], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "interrupted: Terminated\nfd 2 is the terminal again\nafter\n", proc.stderr
    assert proc.stdout == "stdout works\n"
    assert log.read_text() == ("" if where == "swap" else "the body ran\n")


LOST = """
import signal
from lab.base import errors
errors.take_interruptions()
class Finalized:
    def __del__(self):  # a Ctrl-C that lands in a finalizer: its exception is printed as "Exception ignored" and lost
        signal.raise_signal(signal.SIG)
Finalized()
print("went on")
try:
    errors.raise_if_interrupted()
except KeyboardInterrupt as e:
    print(f"raised again: {type(e).__name__}")
errors.take_interruptions()  # a new command starts with none received
errors.raise_if_interrupted()
print("none after a new start")
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interruption_lost_in_a_finalizer_is_raised_again_where_the_lab_can_stop(sig):
    """A census once ran every remaining arm after a SIGINT, its KeyboardInterrupt raised inside regex's
    `Group.__del__` and ignored there; the lab remembers the signal and raises it again before the next arm or block."""
    proc = subprocess.run([sys.executable, "-c", LOST.replace("signal.SIG)", f"signal.{sig})")], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" in proc.stderr
    expected = "KeyboardInterrupt" if sig == "SIGINT" else "Terminated"
    assert proc.stdout == f"went on\nraised again: {expected}\nnone after a new start\n", proc.stdout

"""What pipelines print goes to a log; the lab's progress and results stay on the terminal."""

import subprocess
import sys

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

"""Keeping the terminal readable while pipelines run: what they and the profiler print goes to a log file, the
lab's own progress and results to the terminal.

The pipelines' code paths stay exactly as they are in both arms (their progress bars still run: `no_progress_bar`
is a fix under test); only where the text lands changes. File descriptors 1 and 2 point at the log while
:func:`captured` is active, so C++ output (the profiler's `USDT:` lines) lands there too, and Python's `sys.stderr`
(tqdm, warnings) with them; `sys.stdout` and :func:`progress` still reach the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from lab.base.errors import interruptions_deferred

_terminal: TextIO | None = None  # the terminal's stderr while output is captured
_pending = False  # a transient line is on the terminal, not yet ended


def progress(msg: str) -> None:
    """A progress line for the user, on the terminal's stderr also while output is captured.

    A message that starts with "\r" is transient: on a terminal the next message overwrites it (a running status
    such as the current block and interval), elsewhere (a log file, a pipe) it is an ordinary line."""
    global _pending
    stream = _terminal or sys.stderr
    transient = msg.startswith("\r")
    text = msg[1:] if transient else msg
    if transient and stream.isatty():
        stream.write("\r" + text + "\x1b[K")
        stream.flush()
        _pending = True
        return
    if _pending:
        stream.write("\n")
        _pending = False
    print(text, file=stream, flush=True)


@contextlib.contextmanager
def captured(log: Path | None) -> Iterator[Path | None]:
    """Send everything printed below the lab (file descriptors 1 and 2, `sys.stderr`) to `log` (appended);
    `log=None` captures nothing. Restored on exit, also on errors; a Ctrl-C or a time limit's SIGTERM during the
    swap or the restore waits until it is whole. Nested use keeps the outer capture."""
    if log is None or _terminal is not None:
        yield None
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    undo = contextlib.ExitStack()  # what the swap did, undone in reverse, each step also if another fails
    try:
        with interruptions_deferred():
            _swap(log, undo)
        yield log
    finally:
        with interruptions_deferred():
            undo.close()


def _swap(log: Path, undo: contextlib.ExitStack) -> None:
    """Point file descriptors 1 and 2 and `sys.stderr` at `log`, `sys.stdout` and :func:`progress` at the terminal;
    each step registers its own undoing on `undo`."""
    global _terminal
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {}
    for fd in (1, 2):
        saved[fd] = os.dup(fd)
        undo.callback(os.close, saved[fd])
        undo.callback(os.dup2, saved[fd], fd)
    sink = undo.enter_context(open(log, "ab", buffering=0))
    for fd in (1, 2):
        os.dup2(sink.fileno(), fd)
    undo.callback(_put_back, sys.stdout, sys.stderr)
    _terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    undo.callback(_terminal.close)
    sys.stdout = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    undo.callback(sys.stdout.close)
    sys.stderr = os.fdopen(os.dup(sink.fileno()), "w", buffering=1)
    undo.callback(sys.stderr.close)


def _put_back(stdout: TextIO, stderr: TextIO) -> None:
    global _terminal
    sys.stdout, sys.stderr, _terminal = stdout, stderr, None


def lines_in(log: Path | None) -> int:
    """How many lines a capture wrote (progress bars redraw with carriage returns: each redraw counts)."""
    if log is None or not log.exists():
        return 0
    text = log.read_bytes()
    return text.count(b"\n") + text.count(b"\r")


@contextlib.contextmanager
def routed_warnings(take: Callable[[str, str], bool]):
    """Every warning raised inside goes to `take(message, filename)` first; those it does not take (False) are shown
    as usual. Each warning is raised every time (`always`), not once per place."""
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not take(str(message), filename):
            original(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = original

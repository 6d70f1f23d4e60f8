"""Errors the lab reports to the user as one line, without a traceback."""

from __future__ import annotations

import contextlib
import difflib
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path


class LabError(Exception):
    """A user-facing error: the CLI prints `ERROR: <message>` and exits with `exit_code`."""

    exit_code = 1


class UsageError(LabError):
    """Bad input from the user (an unknown name, a bad option): exit code 2."""

    exit_code = 2


#: the signals the lab takes as an interruption, after which it keeps what it completed: a Ctrl-C, and a time limit's
#: SIGTERM
INTERRUPTIONS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, as a time limit sends it (`timeout`, Slurm, a container stop), taken as an interruption: the lab
    stops after its last complete block and keeps what it measured, as after a Ctrl-C."""


def during_interruption(e: BaseException) -> bool:
    """Whether `e` is an interruption (Ctrl-C, a time limit's SIGTERM) or was raised while one was being handled: a
    library's cleanup that failed on the way out (a profiler stopped before it had started, say). Such a failure is
    the interruption, to be kept as one, not a failure of what was measured."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        todo += [e.__context__, e.__cause__]
    return False


#: the interruptions (signal numbers) that reached this process since `take_interruptions`: kept because the
#: exception a signal raises is lost where it lands in a finalizer (a `__del__` that the garbage collector runs: Python
#: prints "Exception ignored in ..." and goes on), and `raise_if_interrupted` raises it again
_received: list[int] = []


def take_interruptions() -> None:
    """From now on a Ctrl-C raises KeyboardInterrupt and a SIGTERM `Terminated` in the main thread, each remembered
    for `raise_if_interrupted`; a second SIGTERM while the lab keeps what it measured is ignored (the sender's SIGKILL,
    or a second Ctrl-C, still ends it at once). A Ctrl-C ignored by the caller (a background job of a script) is taken
    back: stopping after the last complete block and keeping what was measured is how a time limit ends the lab."""
    _received.clear()

    def interrupted(signum, frame):  # noqa: ARG001 - a signal handler's signature
        _received.append(signum)
        raise KeyboardInterrupt

    def terminated(signum, frame):  # noqa: ARG001
        _received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, terminated)


def raise_if_interrupted() -> None:
    """Raise again an interruption whose exception was lost where it landed (in a finalizer), at a point where the lab
    can stop cleanly: before a census's next arm, an A/B's next block. Found on the CPU: a SIGINT that reached a census
    during regex's `Group.__del__` was printed as "Exception ignored" and every remaining arm ran."""
    if _received:
        raise Terminated if _received[-1] == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def interruptions_deferred() -> Iterator[None]:
    """A Ctrl-C or a time limit's SIGTERM that comes during the block is delivered when it ends (its handler runs
    then, raising there), so that the block is never left half done: swapping the output streams, say, where an
    interruption halfway closed the terminal's own stream and the lab lost its stderr. Only the main thread can hold
    signals; elsewhere the block runs as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread() or any(signal.getsignal(s) is None
                                                                        for s in INTERRUPTIONS):
        yield  # (a handler set outside Python could not be put back)
        return
    pending: list[int] = []
    before = {}
    try:
        for signum in INTERRUPTIONS:
            before[signum] = signal.signal(signum, lambda n, frame: pending.append(n))
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if pending and callable(before.get(pending[0])):
            before[pending[0]](pending[0], None)  # raises KeyboardInterrupt or `Terminated` here
        elif pending:  # a default or ignored disposition: as it would have been
            signal.raise_signal(pending[0])


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UsageError:
    """An error for an unknown `kind` name that lists the known names and the closest match."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return UsageError(f"Unknown {kind} `{name}`.{hint} Known {plural(kind)}: {', '.join(known)}.")


def plural(noun: str) -> str:
    """`fix` -> `fixes`, `scenario` -> `scenarios`, `sweep key` -> `sweep keys`."""
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def known_hint(e: BaseException) -> str:
    """What to do about a failure the lab has met before (with a leading space), or ""."""
    if type(e).__name__ == "OutOfMemoryError":
        return " The GPU ran out of memory: try --layers N, a smaller --size, or a machine with more memory."
    if "output of CUDAGraphs that has been overwritten" in str(e):
        return (" CUDA graphs (reduce-overhead) replay into the same output memory, so a graph output read after the"
                " next replay is lost: regional compile hits this because each block reads the last one's output"
                " (pytorch/pytorch#152887). --no-compile-regional compiles the whole transformer instead, and the lab"
                " then clones its outputs so that a pipeline with two guidance calls per step can read both.")
    return ""


def _wrapper_files() -> set[Path]:
    from lab.base.paths import lab_wrapper_paths, package_parent

    try:
        return {(package_parent() / p).resolve() for p in lab_wrapper_paths()}
    except ImportError:
        return set()


def describe_failure(e: BaseException) -> str:
    """One line for an unexpected exception: what was raised, where, and the file that holds the full traceback
    (printed instead when LAB_TRACEBACK=1)."""
    text = "".join(traceback.format_exception(e))
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (in {Path(frames[-1].filename).name}:{frames[-1].lineno}, {frames[-1].name})" if frames else ""
    wrappers = _wrapper_files()
    if frames and Path(frames[-1].filename).resolve() in wrappers:
        # raised where the lab's instrumentation calls a diffusers function (e.g. a signature the call no longer
        # fits): name the code that made the call, not the lab's wrapper
        caller = next((f for f in reversed(frames) if Path(f.filename).resolve() not in wrappers), None)
        if caller is not None:
            where = (f" (in {Path(caller.filename).name}:{caller.lineno}, {caller.name}, through the lab's "
                     f"{Path(frames[-1].filename).stem} wrapper around the function it calls)")
    hint = known_hint(e)
    if os.environ.get("LAB_TRACEBACK") == "1":
        print(text, file=sys.stderr)
        return f"{type(e).__name__}: {e}{where}.{hint}"
    fd, path = tempfile.mkstemp(prefix="lab-traceback-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return f"{type(e).__name__}: {e}{where}.{hint} Full traceback: {path} (or set LAB_TRACEBACK=1)."

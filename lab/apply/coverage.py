"""Line coverage of a few files: which lines of a change's compiled code ran in a call.

`lab ab --patch` counts a diff as exercised when one of the lines it changed runs. The changed definitions are
compiled under a file name of their own (`<module file> [lab patch: NAME]`), so the tracer looks only at frames of
those files and returns no local tracer for any other frame: the rest of the pipeline runs untraced, apart from one
check per Python call. Compiled regions run their Python only when traced, so under torch.compile the call is made
with the compiled functions run eagerly (`force_eager`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator


class LineCoverage:
    """`with LineCoverage(files) as cov: ...` records `cov.hits[file]`: the lines that ran, and the first line of
    every code object of those files that was called."""

    def __init__(self, files: Iterable[str]) -> None:
        self.files = frozenset(files)
        self.hits: dict[str, set[int]] = {f: set() for f in self.files}
        self._previous = None

    def _call(self, frame, event, arg):  # noqa: ARG002 - the sys.settrace signature
        code = frame.f_code
        if code.co_filename not in self.files:
            return None
        self.hits[code.co_filename].add(code.co_firstlineno)
        return self._line

    def _line(self, frame, event, arg):  # noqa: ARG002
        if event == "line":
            self.hits[frame.f_code.co_filename].add(frame.f_lineno)
        return self._line

    def __enter__(self) -> LineCoverage:
        self._previous = sys.gettrace()
        threading.settrace(self._call)
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(self._previous)
        threading.settrace(self._previous)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run torch.compile'd functions eagerly inside (so their Python lines run), where torch can."""
    import torch

    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        yield
        return
    with stance("force_eager"):
        yield

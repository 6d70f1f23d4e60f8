"""The regression test a fix's pull request carries: `fixes/regressions/<fix>.py`.

The file's first line names where it lands in a diffusers checkout (`# diffusers: tests/<folder>/test_<name>.py`, a
new file); the rest is the test module verbatim, written as diffusers writes its tests. It fails on the release without
the change and passes with it: `lab diff --pr` adds it to the pull request's diff as a new file, and `lab upstream
check` runs it in both copies (the released one gets the file the diff adds, without the change it tests).

The folder has no `__init__.py`, so that the fix catalog (one module per fix in `fixes/`) does not take it for a fix and
the lab's own test run does not collect it: these tests import the diffusers checkout they land in.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lab.apply.diff import unified_diff
from lab.base.errors import LabError

#: the first line of a regression test file: where the file lands in a diffusers checkout
HEADER = re.compile(r"\A# diffusers: (tests/[\w./-]+\.py)[ \t]*\n")
#: a diff's section that creates a file
NEW_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)\nnew file mode \d+\n--- /dev/null\n\+\+\+ b/\S+\n", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Regression:
    """A fix's regression test: the fix, the path in a diffusers checkout, and the test module's source."""

    fix: str
    path: str
    source: str


def folder() -> Path:
    """`fixes/regressions/`, beside the fix modules."""
    import fixes

    return Path(fixes.__file__).parent / "regressions"


def regression_of(fix: str, where: Path | None = None) -> Regression | None:
    """The regression test of `fix` (None where it has none yet). A file without the header line is an error: the
    lab cannot place it in the diff."""
    path = (where or folder()) / f"{fix}.py"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    match = HEADER.match(text)
    if not match or ".." in match[1].split("/"):
        raise LabError(f"{path}: its first line must name where the test lands in diffusers, as "
                       "`# diffusers: tests/<folder>/test_<name>.py`.")
    return Regression(fix=fix, path=match[1], source=text[match.end():].lstrip("\n"))


def new_file_diff(path: str, text: str) -> str:
    """A git diff that creates `path` (relative to the repository root) holding `text`."""
    body = unified_diff("", text, path).split("\n", 3)[3]  # the hunks, without the header of a changed file
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n" + body


def added_files(diff: str) -> dict[str, str]:
    """The files a diff creates, with their text (the inverse of :func:`new_file_diff`), in the order given."""
    found = {}
    for match in NEW_FILE.finditer(diff):
        lines = []
        for line in diff[match.end():].splitlines(keepends=True):
            if line.startswith("diff --git "):
                break
            if line.startswith("+"):
                lines.append(line[1:])
            elif line.startswith("\\") and lines:  # "\ No newline at end of file": the last line has none
                lines[-1] = lines[-1].rstrip("\n")
        found[match[1]] = "".join(lines)
    return found

"""The regression test a fix's pull request carries: `fixes/regressions/<fix>.py`.

The file's first line names the project and where the test lands in its checkout (`# diffusers:
tests/<folder>/test_<name>.py`, `# accelerate: tests/test_<name>.py`, a new file); the rest is the test module
verbatim, written as that project writes its tests. It fails on the release without the change and passes with it:
`lab diff --pr` adds it to the pull request's diff as a new file (the hand-written accelerate diffs carry it the same
way, `tests/test_patches.py` holds them to it), and `lab upstream check` runs it in both copies (the released one gets
the file the diff adds, without the change it tests).

The folder has no `__init__.py`, so that the fix catalog (one module per fix in `fixes/`) does not take it for a fix and
the lab's own test run does not collect it: these tests import the diffusers checkout they land in.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lab.apply.diff import unified_diff
from lab.apply.projects import PROJECTS
from lab.base.errors import LabError

#: the first line of a regression test file: the project, and where the file lands in its checkout
HEADER = re.compile(r"\A# (\w+): (tests/[\w./-]+\.py)[ \t]*\n")
#: a diff's section that creates a file
NEW_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)\nnew file mode \d+\n--- /dev/null\n\+\+\+ b/\S+\n", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Regression:
    """A fix's regression test: the fix, the project it goes to, the path in its checkout, and the module's source."""

    fix: str
    path: str
    source: str
    project: str = "diffusers"


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
    if not match or ".." in match[2].split("/") or match[1] not in PROJECTS:
        raise LabError(f"{path}: its first line must name the project and where the test lands in it, as "
                       f"`# diffusers: tests/<folder>/test_<name>.py` (projects: {', '.join(PROJECTS)}).")
    return Regression(fix=fix, path=match[2], source=text[match.end():].lstrip("\n"), project=match[1])


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


def carrying(diff: str, test: Regression) -> str:
    """`diff` carrying `test` as the new file it adds: a section that creates the same path is replaced, else the
    section is appended (how a hand-written diff is kept carrying its regression test)."""
    kept = []
    for section in re.split(r"(?m)^(?=diff --git )", diff):
        match = NEW_FILE.match(section)
        if match and match[1] == test.path:
            continue
        kept.append(section)
    body = "".join(kept)
    return body + ("" if body.endswith("\n") or not body else "\n") + new_file_diff(test.path, test.source)

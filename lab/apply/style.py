"""A project's `make style` on an upstream diff: `ruff format` of the lines the diff adds, and `ruff check` and
`ruff format --check` of the files it touches, with the project's own ruff configuration.

diffusers' `make style` runs `ruff check --fix` and `ruff format` over the repository; its configuration is the
`[tool.ruff]` of its `pyproject.toml` (:data:`DIFFUSERS_RUFF`, as of the release tags the lab diffs against; `lab
upstream check` reads the suite's own `pyproject.toml` where it has one). A diff is restyled line range by line
range (:func:`format_added`): only the lines a rewrite added are formatted (ruff widens a range to the whole logical
lines it touches), so that formatting never puts a change to lines the fix did not touch into a diff; where it would,
the file is left as the rewrite wrote it and a note says so. ruff is the `upstream` extra's (`python -m ruff`, the
version diffusers pins).
"""

from __future__ import annotations

import ast
import collections
import difflib
import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

#: the ruff configuration of diffusers' `pyproject.toml` (v0.40.0; `tests/test_patches.py` holds it to a copy of it)
DIFFUSERS_RUFF = """\
[tool.ruff]
line-length = 119
extend-exclude = [
    "src/diffusers/pipelines/flux2/system_messages.py",
]

[tool.ruff.lint]
# Never enforce `E501` (line length violations).
ignore = ["C901", "E501", "E721", "E741", "F402", "F823"]
select = ["C", "E", "F", "I", "W"]

# Ignore import violations in all `__init__.py` files.
[tool.ruff.lint.per-file-ignores]
"__init__.py" = ["E402", "F401", "F403", "F811"]
"src/diffusers/utils/dummy_*.py" = ["F401"]

[tool.ruff.lint.isort]
lines-after-imports = 2
known-first-party = ["diffusers"]

[tool.ruff.format]
# Like Black, use double quotes for strings.
quote-style = "double"

# Like Black, indent with spaces, rather than tabs.
indent-style = "space"

# Like Black, respect magic trailing commas.
skip-magic-trailing-comma = false

# Like Black, automatically detect the appropriate line ending.
line-ending = "auto"
"""


class StyleError(Exception):
    """ruff could not run (not installed, or it failed on its input): the reason in words."""


class Finding(msgspec.Struct, kw_only=True):
    """One `ruff check` finding: the file (relative to the checkout), its line, the rule and ruff's message."""

    file: str
    line: int
    code: str
    message: str


class FileStyle(msgspec.Struct, kw_only=True):
    """One touched file with the diff: its findings, whether `ruff format --check` passes, and the same of the
    released file (None where the diff creates it) so that what the diff did not bring is told apart."""

    file: str
    findings: list[Finding] = []
    formatted: bool = True
    released_findings: int | None = None
    released_formatted: bool | None = None


class Style(msgspec.Struct, kw_only=True):
    """`ruff check` and `ruff format --check` of the touched files with the diff: `status` is `clean` (nothing the
    diff brings), `findings` (a finding or an unformatted file the released code does not have) or `not run` (ruff
    could not run: `reason` says why)."""

    status: str
    reason: str = ""
    ruff: str = ""
    config: str = ""
    files: list[FileStyle] = []


def _ruff(args: Sequence[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, input=stdin, capture_output=True,
                              text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StyleError(f"ruff did not run: {e}") from None


def version() -> str:
    """ruff's version (`ruff 0.9.10`); StyleError where it is not installed."""
    done = _ruff(["--version"], Path.cwd())
    if done.returncode != 0:
        raise StyleError("ruff is not installed here (`pip install -e .[upstream]`)")
    return done.stdout.strip()


def _changed_ranges(old: str, new: str) -> list[tuple[int, int]]:
    """The line ranges of `new` (1-based, inclusive) that are not in `old`, in order."""
    matcher = difflib.SequenceMatcher(None, old.splitlines(True), new.splitlines(True), autojunk=False)
    return [(j1 + 1, j2) for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert") and j2 > j1]


def _changed_old_lines(old: str, new: str) -> set[int]:
    """The lines of `old` (0-based) that `new` removes or replaces."""
    matcher = difflib.SequenceMatcher(None, old.splitlines(True), new.splitlines(True), autojunk=False)
    found: set[int] = set()
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            found.update(range(i1, i2))
    return found


def _widened(source: str, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` (1-based, inclusive) of `source` widened to the whole statements they touch, merged where they meet:
    ruff formats a range's logical lines only where the range encloses them."""
    lines = _statements(source, {n - 1 for start, stop in ranges for n in range(start, stop + 1)})
    merged: list[tuple[int, int]] = []
    for n in sorted(lines):
        if merged and n <= merged[-1][1]:  # next to the last range: it grows
            merged[-1] = (merged[-1][0], n + 1)
        else:
            merged.append((n + 1, n + 1))
    return merged


@functools.lru_cache(maxsize=64)
def _statement_spans(source: str) -> tuple[tuple[int, int], ...] | None:
    """Each statement's first and last line (0-based; a compound statement's header only), parsed once per source;
    None where it does not parse."""
    try:
        nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)]
    except SyntaxError:
        return None
    spans = []
    for node in nodes:
        body = getattr(node, "body", None)
        last = (body[0].lineno - 1 if body and isinstance(body, list) and isinstance(body[0], ast.AST)
                else node.end_lineno)
        spans.append((node.lineno - 1, max(last, node.lineno) - 1))
    return tuple(spans)


def _statements(source: str, lines: set[int]) -> set[int]:
    """`lines` (0-based) of `source` widened to the statements they belong to: the smallest statement holding each
    (a compound statement by its header, not its body). ruff formats a logical line whole, so a fix that changes part
    of a statement may have the rest of it reformatted."""
    spans = _statement_spans(source)
    if spans is None:
        return set(lines)
    widened = set(lines)
    for line in lines:
        holding = [(b - a, a, b) for a, b in spans if a <= line <= b]
        if holding:
            _, a, b = min(holding)
            widened.update(range(a, b + 1))
    return widened


def format_added(old: str, new: str, path: str, config: str = DIFFUSERS_RUFF) -> tuple[str, str]:
    """`new` (the rewrite of `old`, the file at `path` in a checkout) with the lines it adds formatted by `ruff
    format` under `config` (a pyproject's text), and a note ("" when there is nothing to say). The ranges are
    formatted from the last to the first, so that each one's line numbers still hold. Where formatting them would
    change lines the rewrite did not, `new` comes back as it is, with a note."""
    ranges = _changed_ranges(old, new)
    if not ranges or not path.endswith(".py"):
        return new, ""
    with tempfile.TemporaryDirectory(prefix="lab-style-") as root:
        Path(root, "pyproject.toml").write_text(config, encoding="utf-8")
        whole = _ruff(["format", "--config", "pyproject.toml", "--no-cache", "--stdin-filename", path, "-"],
                      Path(root), stdin=new)
        if whole.returncode == 0 and whole.stdout == new:  # as `make style` leaves it already: one run of ruff
            return new, ""
        ranges = _widened(new, ranges)
        text = new
        for start, stop in reversed(ranges):
            # (a range's end with no column is the start of that line: the start of the next one takes in `stop`)
            done = _ruff(["format", "--config", "pyproject.toml", "--no-cache", "--stdin-filename", path,
                          f"--range={start}-{stop + 1}", "-"], Path(root), stdin=text)
            if done.returncode != 0:
                return new, f"not formatted: ruff format failed ({(done.stderr.strip().splitlines() or [''])[-1]})"
            text = done.stdout
    if not _changed_old_lines(old, text) <= _statements(old, _changed_old_lines(old, new)):
        return new, ("not formatted: `ruff format` of the added lines would also change lines the fix does not "
                     "touch (`lab upstream check` reports the file's format)")
    return text, ""


def _findings(root: Path, files: Sequence[str]) -> dict[str, list[Finding]]:
    done = _ruff(["check", "--config", "pyproject.toml", "--no-cache", "--output-format", "json", *files], root)
    try:
        if done.returncode not in (0, 1):  # 2: ruff itself failed (its configuration, an unreadable file)
            raise ValueError
        raw = json.loads(done.stdout or "[]")
    except ValueError:
        raise StyleError(f"ruff check failed: {(done.stderr.strip().splitlines() or [''])[-1]}") from None
    found: dict[str, list[Finding]] = {f: [] for f in files}
    for item in raw:
        file = Path(item["filename"]).resolve().relative_to(root.resolve()).as_posix()
        found.setdefault(file, []).append(Finding(file=file, line=item["location"]["row"], code=item["code"] or "",
                                                  message=item["message"]))
    return found


def _unformatted(root: Path, files: Sequence[str]) -> set[str]:
    done = _ruff(["format", "--check", "--config", "pyproject.toml", "--no-cache", *files], root)
    if done.returncode not in (0, 1):
        raise StyleError(f"ruff format --check failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
    return {line.split(":", 1)[1].strip() for line in done.stdout.splitlines() if line.startswith("Would reformat:")}


def check_files(released: Path, changed: Path, files: Sequence[str], config: str, where: str,
                new: Sequence[str] = ()) -> Style:
    """`ruff check` and `ruff format --check` of `files` (paths in a checkout) in the checkout `changed` (with the
    diff) and, for those that exist there and are not among the files the diff creates (`new`), in `released`, each
    under `config` (a pyproject's text, from `where`)."""
    try:
        ruff = version()
        for root in (released, changed):
            (root / "pyproject.toml").write_text(config, encoding="utf-8")
        files = [f for f in files if f.endswith(".py") and (changed / f).is_file()]
        before = [f for f in files if (released / f).is_file() and f not in new]
        found, unformatted = _findings(changed, files), _unformatted(changed, files)
        found_before = _findings(released, before) if before else {}
        unformatted_before = _unformatted(released, before) if before else set()
    except StyleError as e:
        return Style(status="not run", reason=str(e), config=where)
    report = []
    new = 0
    for f in files:
        was = found_before.get(f) if f in before else None
        brought = collections.Counter((x.code, x.message) for x in found[f])
        brought.subtract(collections.Counter((x.code, x.message) for x in was or []))
        new += sum(n for n in brought.values() if n > 0)
        formatted = f not in unformatted
        released_formatted = None if f not in before else f not in unformatted_before
        if not formatted and released_formatted is not False:
            new += 1
        report.append(FileStyle(file=f, findings=found[f], formatted=formatted,
                                released_findings=None if was is None else len(was),
                                released_formatted=released_formatted))
    if new:
        return Style(status="findings", reason=f"{new} finding{'s' if new > 1 else ''} the released files do not have",
                     ruff=ruff, config=where, files=report)
    inherited = [f.file for f in report if f.findings or not f.formatted]
    reason = "ruff check and ruff format --check pass on every touched file" if not inherited else (
        "nothing the diff brings; as released: " + ", ".join(inherited))
    return Style(status="clean", reason=reason, ruff=ruff, config=where, files=report)


def style_diff(body: str, source_of: Callable[[str], str | None],
               config: str = DIFFUSERS_RUFF) -> tuple[str, list[str]]:
    """`body` (a unified diff of a checkout's files, `src/<package>/...`) with the lines it adds formatted
    (:func:`format_added`), file by file, and a note per file left as it was. `source_of` gives a file's released
    text by its path inside the package (`diffusers/x.py`), None where the release lacks it (that file is kept as
    it is)."""
    from lab.apply import change
    from lab.apply.diff import unified_diff

    out, notes = [], []
    for file in change.parse(body):
        path = file.path
        inside = path.split("/", 1)[1] if path.startswith("src/") else None
        old = source_of(inside) if inside and file.old_path else None
        section = _section(body, file)
        if old is None:
            out.append(section)
            continue
        new = change.apply(change.Applied(old, set()), file, path).source
        formatted, note = format_added(old, new, path, config)
        out.append(unified_diff(old, formatted, path) if formatted != new else section)
        if note:
            notes.append(f"{path}: {note}")
    return "".join(out), notes


def _section(body: str, file) -> str:
    """The text of one file's section of a diff, as it is."""
    start = body.index(f"diff --git a/{file.old_path or file.new_path} ")
    end = body.find("\ndiff --git ", start)
    return body[start:] if end < 0 else body[start:end + 1]

"""Where a command writes, checked before any work: a run of minutes that could not keep its result at its end has
lost those minutes. Every command that writes results asks :func:`check` of each folder it writes to (`--out`,
`--trace-dir`, `--report`, ...) before it builds anything, and a folder that cannot take the files is one error,
exit code 2 (`lab.base.errors.UsageError`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from lab.base import files
from lab.base.errors import UsageError

#: the least free space a command's folders must have: a conservative estimate of what one run writes (a result, its
#: page and plot, a few gzipped traces of a true-size call); under it the command is refused before any work
MIN_FREE_BYTES = 50 * 2**20

#: what the lab adds to a file's name beside it: the temporary name of `files.whole`
#: (`.NAME.<8 random characters>.partial.json.gz`) and the lock of `files.claim` (`.NAME.lock`)
_BESIDE = len(".") + len(".") + 8 + len(files.PARTIAL) + len(".json.gz")


def check_name(name: str | None, option: str = "--name") -> str | None:
    """`name` (a result's file name without its folder) if it is one: no path separator, no `..`, nothing hidden, so
    that the result stays inside its `--out`; None stays None."""
    if name is None:
        return None
    seps = {os.sep, os.altsep or os.sep, "/"}
    if not name.strip() or any(s in name for s in seps) or ".." in name or name.startswith(".") or "\0" in name:
        raise UsageError(f"`{option} {name}`: a result name is one file name, without a path separator, `..` or a "
                         "leading `.`; choose the folder with `--out`.")
    return name


def check(folder: Path | str, names: Iterable[str | Path] = (), option: str = "--out", claim: Iterable[str | Path] = (),
          free: int = MIN_FREE_BYTES) -> Path:
    """Refuse `folder` (given as `option`) unless the lab can write `names` and `claim` (paths relative to it) there:
    every part of it that exists is a folder, the nearest existing one takes a new file (written and removed at
    once: the permission bits do not say so on a read-only file system, nor for root), each name stays inside it and
    is short enough for the file system with what the lab puts beside it, and its file system has `free` bytes free.
    Then the results named in `claim` are this command's until it ends (`files.claim`: another command writing one
    of them is refused at its start)."""
    folder = Path(folder)
    claim = list(claim)
    names = [*names, *claim]
    shown = f"`{option} {folder}`"
    inside = Path(os.path.abspath(folder))
    targets = [Path(os.path.abspath(folder / n)) for n in names]
    for name, target in zip(names, targets):
        if target != inside and inside not in target.parents:
            raise UsageError(f"{shown}: `{name}` would be written outside it, at {target}.")
    parts = [inside, *(t.parent for t in targets)]
    existing = _nearest_existing(inside, shown)
    for path in parts:
        _nearest_existing(path, shown)  # a file where a folder belongs, anywhere on the way
    limit = _name_max(existing)
    for path in [*targets, inside]:
        new = path.relative_to(existing).parts if path.is_relative_to(existing) else path.parts
        for i, part in enumerate(new):
            beside = _BESIDE if path in targets and i == len(new) - 1 else 0  # a file, with its temporary name
            if len(part.encode()) + beside > limit:
                raise UsageError(f"{shown}: the name `{part[:40]}...` is too long for the file system ({len(part)} "
                                 f"characters; at most {limit - beside} here, with what the lab writes beside it).")
    try:
        fd, probe = tempfile.mkstemp(prefix=".lab-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{shown}: cannot write in {existing} ({e.strerror or e}); choose a folder this user can "
                         "write to.") from None
    left = shutil.disk_usage(existing).free
    if left < free:
        raise UsageError(f"{shown}: only {left / 2**20:.1f} MB free on the file system of {existing}, and a run "
                         f"needs at least {free / 2**20:.0f} MB there for its results and traces (a conservative "
                         "estimate): free some space or write elsewhere.")
    for name in claim:
        files.claim(folder / name)
    return folder


def _nearest_existing(path: Path, shown: str) -> Path:
    """The nearest folder at or above `path` that exists; an error where a file stands in the way."""
    for candidate in (path, *path.parents):
        if os.path.isdir(candidate):  # (False, not an error, for a name too long: the length check says so)
            return candidate
        if os.path.lexists(candidate):
            raise UsageError(f"{shown}: {candidate} is a file, not a folder.")
    raise UsageError(f"{shown}: no folder of it exists.")  # (the root always does)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255

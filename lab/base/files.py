"""The one rule for every file the lab writes: whole or not at all. A file is written beside its target under a
temporary name and renamed over it only once complete, so that a Ctrl-C, a full disk or a crash mid-write leaves the
earlier file as it was (never a truncated trace, page or result in its place)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path


PARTIAL = ".partial"


def written(paths: Iterable[Path]) -> list[Path]:
    """`paths` without the temporary files of :func:`whole` (`.{name}.XXXX.partial.json`): a process killed mid-write
    (SIGKILL cannot be caught) leaves one behind, which every reader that globs a folder for results must pass over
    as what it is, not a result."""
    return [p for p in paths if not (p.name.startswith(".") and PARTIAL in p.name)]


_CREATED = re.compile(rb'"created":\s*"([^"]+)"')


def newest_last(paths: Iterable[Path]) -> list[Path]:
    """Result files in the order they were measured: by the `created` time each records near its top (a clone or a
    tarball gives files arbitrary modification times, and once a clean clone of main read a cell's older result as
    its newest), else by the modification time; the name breaks a tie."""
    def when(path: Path) -> tuple[str, float, str]:
        mtime = path.stat().st_mtime
        with open(path, "rb") as f:
            found = _CREATED.search(f.read(4096))
        created = found[1].decode() if found else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
        return created, mtime, path.name

    return sorted(paths, key=when)


@contextlib.contextmanager
def whole(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path` to write to (by any means: a library's export, `savefig`); on leaving the
    block without an exception it replaces `path`, otherwise it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL + "".join(path.suffixes[-2:]),
                               dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # as a plain open() would make it (mkstemp makes 0600)
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: Path | str, text: str) -> Path:
    """`path.write_text(text)`, whole or not at all."""
    with whole(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: Path | str, data: bytes) -> Path:
    with whole(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)

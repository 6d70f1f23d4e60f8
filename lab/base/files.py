"""The one rule for every file the lab writes: whole or not at all. A file is written beside its target under a
temporary name and renamed over it only once complete, so that a Ctrl-C, a full disk or a crash mid-write leaves the
earlier file as it was (never a truncated trace, page or result in its place).

And one writer per result: a command claims its result files before it measures (:func:`claim`, a lock on a file
beside each, `.NAME.lock`), so that a second command writing the same result refuses at its start instead of both
measuring and the later one silently replacing the earlier one's result."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from lab.base.errors import LabError, UsageError

PARTIAL = ".partial"


def written(paths: Iterable[Path]) -> list[Path]:
    """`paths` without the temporary files of :func:`whole` (`.{name}.XXXX.partial.json`): a process killed mid-write
    (SIGKILL cannot be caught) leaves one behind, which every reader that globs a folder for results must pass over
    as what it is, not a result."""
    return [p for p in paths if not (p.name.startswith(".") and PARTIAL in p.name)]


_CREATED = re.compile(rb'"created":\s*"([^"]+)"')


def newest_last(paths: Iterable[Path]) -> list[Path]:
    """Result files in the order they were measured: by the `created` time each records near its top (a clone or a
    tarball gives files arbitrary modification times, by which a clean clone would read a cell's older result as its
    newest), else by the modification time; the name breaks a tie."""
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
    block without an exception it replaces `path`, otherwise it is removed and `path` is untouched. A `path` that
    another process has claimed (:func:`claim`) is refused: that process is measuring it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_if_claimed(path)
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


# --- one writer per result ---------------------------------------------------------------------------------------

#: the result files this process has claimed, each with the open lock file that holds its claim
_claimed: dict[Path, tuple[int, Path]] = {}


def lock_of(path: Path | str) -> Path:
    """The lock file of a result: `.NAME.lock` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


def claim(path: Path | str) -> Path:
    """Claim `path` for this process until :func:`release` (the command's end: `lab.cli`; or its exit, which the
    kernel takes as a release): an exclusive `flock` on its lock file, which says who holds it. Another process's
    claim is a `UsageError` naming that process, before any work. Claiming a path twice is one claim."""
    path = Path(path)
    key = Path(os.path.abspath(path))
    if key in _claimed:
        return path
    lock = lock_of(key)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UsageError(f"{path} is being written by another lab ({_holder(lock)}): wait for it to end, or "
                             "write this run elsewhere (`--out`, `--name`).") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:  # its holder released it (and removed it) between our open and our lock
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()}, `{shlex.join(['lab', *sys.argv[1:]])}`, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    _claimed[key] = (fd, lock)
    return path


def release(path: Path | str) -> None:
    """Give up the claim on `path` (its lock file removed while still held, so that no later claim takes a lock
    file on its way out)."""
    held = _claimed.pop(Path(os.path.abspath(path)), None)
    if held is None:
        return
    fd, lock = held
    with contextlib.suppress(OSError):
        os.unlink(lock)
    os.close(fd)


def release_all() -> None:
    """Give up every claim of this process (a command's end)."""
    for key in list(_claimed):
        release(key)


def _holder(lock: Path) -> str:
    try:
        text = lock.read_text().strip()
    except OSError:
        text = ""
    return text or "a process that left no note"


def _refuse_if_claimed(path: Path) -> None:
    """Another process's claim on `path` refuses the write; a lock file nobody holds (its holder was killed) is
    nothing."""
    lock = lock_of(path)
    if Path(os.path.abspath(path)) in _claimed or not lock.exists():
        return
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        raise LabError(f"{path} is being written by another lab ({_holder(lock)}): not written over.") from None
    finally:
        os.close(fd)

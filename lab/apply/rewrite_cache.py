"""The rewrite of one diffusers module by a fix's codemods, worked out once: in memory per process, and on disk (the
lab's cache folder) across processes, under a key of everything the answer depends on."""

from __future__ import annotations

import contextlib
import hashlib
import json
from functools import cache
from pathlib import Path

from lab.apply import rewrite as rw
from lab.base import files


@cache
def rewrite(source: str, codemods: tuple[type[rw.FunctionRewrite], ...], path: str) -> rw.RewriteResult:
    """`rw.rewrite_source`, worked out once: in memory per process, and on disk (in the lab's cache folder) across
    processes, since a fix's rewrites can take seconds (begin_index rewrites dozens of pipeline modules) and
    `lab fixes`, `lab diff` and every run that applies a fix ask for the same ones. The key holds everything the
    answer depends on: the module source itself (another diffusers, or a changed file, is another key), the
    codemods in order, and the source of every fix and of the rewrite machinery with libcst's version, so a changed
    fix never gets a stale answer. A codemod that fails raises as before and stores nothing."""
    names = "\0".join(f"{c.__module__}.{c.__qualname__}" for c in codemods)
    key = hashlib.sha256("\0".join((source, path, names, _rewriting_code())).encode()).hexdigest()
    stored = _rewrite_cache() / f"{key}.json"
    try:
        found = json.loads(stored.read_text())
        new, warnings = found["new_source"], tuple(found["warnings"])
        if isinstance(new, str) and all(isinstance(w, str) for w in warnings):
            return rw.RewriteResult(source, new, warnings)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none stored, or damaged: worked out again and stored afresh
    result = rw.rewrite_source(source, codemods, filename=path)
    with contextlib.suppress(OSError):  # a read-only cache folder costs time, not correctness
        files.write_text(stored, json.dumps({"new_source": result.new_source, "warnings": list(result.warnings)}))
    return result


def _rewrite_cache() -> Path:
    from lab.apply.releases import cache_dir

    return cache_dir() / "rewrites"


@cache
def _rewriting_code() -> str:
    """The source that decides what a codemod does: every fix module and the lab's rewrite machinery, with the
    libcst version."""
    from importlib.metadata import version

    import fixes

    parts = [version("libcst"), Path(rw.__file__).read_text()]
    parts += [p.read_text() for p in sorted(Path(fixes.__file__).parent.glob("*.py"))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()

"""Where the lab itself lives. Nothing the lab writes goes there: results, traces and campaign jobs go where the
user runs the command (or to `--out`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def package_parent() -> Path:
    """The folder that holds the `lab` package: the checkout for an editable install, site-packages for a wheel.
    Child processes (`python -m lab...`) get it on their `PYTHONPATH`, so that they import this same lab."""
    import lab

    return Path(lab.__file__).resolve().parents[1]


def child_pythonpath(*first: str | Path) -> str:
    """The `PYTHONPATH` of a child process (`python -m lab...`): `first` (a diffusers to import instead of the
    installed one, or another lab), then the folder holding this `lab` package, then this process's own."""
    import os

    return os.pathsep.join([*map(str, first), str(package_parent()), os.environ.get("PYTHONPATH", "")])


def checkout() -> Path | None:
    """The git checkout the lab runs from, or None for an installed wheel."""
    root = package_parent()
    return root if (root / ".git").exists() else None


#: the lab's own modules whose functions wrap diffusers code in a trace (timers, counters, patches): never "user
#: code". Found by their module names, so that moving one moves its pattern (a test checks that each exists).
LAB_WRAPPERS = ("lab.run.instrument", "lab.run.runner", "lab.apply.patching")


def lab_wrapper_paths() -> tuple[str, ...]:
    """`lab/run/instrument.py`, ...: the paths (from the folder holding the `lab` package) of :data:`LAB_WRAPPERS`,
    as a trace's Python frames end them."""
    top = package_parent()
    out = []
    for name in LAB_WRAPPERS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ImportError(f"{name} (in LAB_WRAPPERS) does not exist: update LAB_WRAPPERS after moving it")
        out.append(Path(spec.origin).resolve().relative_to(top).as_posix())
    return tuple(out)


def trim_path(filename: str) -> str:
    """A path relative to the longest `sys.path` entry holding it, as the profiler names frames
    (`/tmp/site/diffusers/x.py` -> `diffusers/x.py`)."""
    f = filename.replace("\\", "/")
    roots = sorted((r.replace("\\", "/").rstrip("/") + "/" for r in sys.path if r), key=len, reverse=True)
    for root in roots:
        if f.startswith(root):
            return f[len(root):]
    for marker in ("site-packages/", "dist-packages/"):
        if marker in f:
            return f.split(marker, 1)[1]
    return f

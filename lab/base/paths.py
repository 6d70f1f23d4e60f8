"""Where the lab itself lives. Nothing the lab writes goes there: results, traces and campaign jobs go where the
user runs the command (or to `--out`)."""

from __future__ import annotations

from pathlib import Path


def package_parent() -> Path:
    """The folder that holds the `lab` package: the checkout for an editable install, site-packages for a wheel.
    Child processes (`python -m lab...`) get it on their `PYTHONPATH`, so that they import this same lab."""
    import lab

    return Path(lab.__file__).resolve().parents[1]


def checkout() -> Path | None:
    """The git checkout the lab runs from, or None for an installed wheel."""
    root = package_parent()
    return root if (root / ".git").exists() else None

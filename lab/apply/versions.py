"""Versions of the installed libraries the lab patches and measures."""

from __future__ import annotations

from packaging.version import Version


def diffusers_version() -> Version:
    """The version of the diffusers that is imported (the one the fixes patch)."""
    import diffusers

    return Version(diffusers.__version__)


def is_at_least(version: str | None) -> bool:
    """True when the imported diffusers is `version` or newer (False for `None`)."""
    return version is not None and diffusers_version() >= Version(version)

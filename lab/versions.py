"""Versions of the installed libraries the lab patches and measures."""

from __future__ import annotations

import importlib.metadata

from packaging.version import Version


def diffusers_version() -> Version:
    """The installed diffusers version (the one the fixes patch)."""
    return Version(importlib.metadata.version("diffusers"))


def is_at_least(version: str | None) -> bool:
    """True when the installed diffusers is `version` or newer (False for `None`)."""
    return version is not None and diffusers_version() >= Version(version)

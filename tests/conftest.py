"""Shared test helpers: upstream diffusers releases (fetched once from PyPI into .cache/) and the shared data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
SHARED = Path(os.environ.get("LAB_SHARED", ROOT.parent / "shared"))
PINNED = re.search(r'"diffusers==([^"]+)"', (ROOT / "pyproject.toml").read_text())[1]


def pytest_configure(config):
    """The tests compare against the diffusers that pyproject.toml pins (rewrites, committed patches, 0.38.0 ASTs);
    other releases are tested through their own unpacked wheels. Another installed diffusers is a setup error, said
    once, rather than tests that quietly skip."""
    from lab.versions import diffusers_version

    found = str(diffusers_version())
    if found != PINNED:
        pytest.exit(f"the tests need diffusers {PINNED} (pinned in pyproject.toml), found {found}: run `make test`, "
                    "which installs the pinned environment into .venv", returncode=4)


def diffusers_release(version: str) -> Path:
    """An unpacked diffusers wheel (`<dir>/diffusers/...`), downloaded from PyPI once and cached in .cache/."""
    target = CACHE / f"diffusers-{version}"
    if (target / "diffusers" / "__init__.py").exists():
        return target
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = list(wheels.glob(f"diffusers-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels),
             f"diffusers=={version}"],
            check=True,
        )
        found = list(wheels.glob(f"diffusers-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        z.extractall(target, members=[n for n in z.namelist() if n.startswith("diffusers/")])
    return target


def upstream_source(version: str, module: str) -> str:
    path = diffusers_release(version) / (module.replace(".", "/") + ".py")
    return path.read_text()


@pytest.fixture(scope="session")
def shared_trace() -> Path:
    path = SHARED / "traces" / "wan_base_compile.json.gz"
    if not path.exists():
        raise FileNotFoundError(f"The shared real trace is missing: {path} (set LAB_SHARED to the shared/ folder).")
    return path

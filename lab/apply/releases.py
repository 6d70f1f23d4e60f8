"""Other diffusers than the installed one, offline: releases, checkouts and site-packages folders.

A SPEC names a diffusers:

- a release, `0.38.0`: its wheel from a wheel folder (`LAB_WHEELS`, folders separated by `:`, and the lab's cache
  `~/.cache/lab/wheels`), else one that pip downloads into the cache (from its own cache when offline);
- a source checkout: a folder holding `src/diffusers`;
- a site-packages folder: a folder holding `diffusers/`;
- a wheel file, `diffusers-0.38.0-py3-none-any.whl`.

:func:`resolve` turns a SPEC into a folder to put first on a worker process's `PYTHONPATH` (a release's wheel is
unpacked once into `~/.cache/lab/diffusers/<version>/`); :func:`module_source` reads one module of a release straight
out of its wheel, for the diffs and checks that need a release's source but not its code. :func:`find_wheel` and
:func:`unpack` take another pure-Python package's name too (`package="accelerate"`, for `lab upstream check` of the
accelerate diffs): its wheel the same way, unpacked into `~/.cache/lab/<package>/<version>/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from lab.base.errors import LabError, UsageError

#: the newest diffusers release the lab was checked against (`lab diff --pr` diffs against it by default)
NEWEST = "0.42.1"
WHEEL = re.compile(r"^diffusers-(?P<version>[^-]+)-py3-none-any\.whl$")
VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


def cache_dir() -> Path:
    return Path(os.environ.get("LAB_CACHE", Path.home() / ".cache" / "lab"))


def wheel_dirs() -> list[Path]:
    """Where release wheels are looked for: `LAB_WHEELS` (folders separated by `:`), then the lab's cache."""
    named = [Path(p) for p in os.environ.get("LAB_WHEELS", "").split(os.pathsep) if p]
    return named + [cache_dir() / "wheels"]


@dataclasses.dataclass(frozen=True)
class Diffusers:
    """One diffusers the lab can run: `site` is the folder to put first on `PYTHONPATH` (None: the installed one)."""

    spec: str
    version: str
    site: Path | None
    origin: str

    def to_dict(self) -> dict:
        return {"spec": self.spec, "version": self.version, "site": str(self.site) if self.site else None,
                "origin": self.origin}


def installed() -> Diffusers:
    import diffusers

    return Diffusers("installed", diffusers.__version__, None, f"installed: {Path(diffusers.__file__).parent}")


def wheel_pattern(package: str = "diffusers") -> re.Pattern:
    """The file name of a release wheel of `package` (pure Python: `<package>-<version>-py3-none-any.whl`)."""
    return WHEEL if package == "diffusers" else re.compile(rf"^{re.escape(package)}-(?P<version>[^-]+)-py3-none-any\.whl$")


def release_wheels(package: str = "diffusers") -> dict[Version, Path]:
    """Every release wheel of `package` (diffusers unless named) in the wheel folders, by version (the first folder
    wins)."""
    pattern = wheel_pattern(package)
    found: dict[Version, Path] = {}
    for folder in wheel_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            match = pattern.match(path.name)
            if match:
                try:
                    found.setdefault(Version(match["version"]), path)
                except InvalidVersion:
                    continue
    return dict(sorted(found.items()))


def _version(spec: str) -> Version | None:
    try:
        return Version(spec)
    except InvalidVersion:
        return None


def find_wheel(version: str, download: bool = True, package: str = "diffusers") -> Path:
    """The wheel of `package` (diffusers unless named) `version`: from a wheel folder, else downloaded by pip into the
    cache (accelerate's, for `lab upstream check` of its diffs, the same way)."""
    wanted = Version(version)
    wheel = release_wheels(package).get(wanted)
    if wheel is not None:
        return wheel
    folders = ", ".join(str(p) for p in wheel_dirs())
    if not download:
        raise UsageError(f"No wheel of {package} {version} in {folders}.")
    target = cache_dir() / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        done = subprocess.CompletedProcess(command, 1, "", str(e))
    wheel = release_wheels(package).get(wanted)
    if done.returncode != 0 or wheel is None:
        last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no wheel came back"]
        raise UsageError(f"{package} {version}: no wheel in {folders}, and pip could not download one ({last[0]}). "
                         f"Put {package}-{version}-py3-none-any.whl into one of those folders (`pip download "
                         f"{package}=={version} --no-deps -d DIR` on a machine with network), or set LAB_WHEELS.")
    return wheel


def unpack(wheel: Path, package: str = "diffusers") -> Path:
    """A folder holding the wheel's `<package>/` (diffusers unless named; unpacked once into the cache; atomic)."""
    match = wheel_pattern(package).match(wheel.name)
    if not match:
        raise UsageError(f"{wheel} is not a {package} wheel ({package}-<version>-py3-none-any.whl).")
    target = cache_dir() / package / match["version"]
    if (target / package / "__init__.py").is_file():
        return target
    created = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{match['version']}-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            z.extractall(scratch, [n for n in names if n.startswith(f"{package}/")])
        if not (scratch / package / "__init__.py").is_file():  # (a wheel named for the package, of another one)
            tops = sorted({n.split("/", 1)[0] for n in names if "/" in n and ".dist-info" not in n.split("/", 1)[0]})
            raise UsageError(f"{wheel} holds no {package} package (no `{package}/__init__.py`; its packages: "
                             f"{', '.join(tops) or 'none'}): give a {package} wheel, release, checkout or "
                             "site-packages folder.")
        try:
            scratch.rename(target)
        except OSError:  # another process unpacked it first
            if not (target / package / "__init__.py").is_file():
                raise
    except zipfile.BadZipFile as e:
        raise UsageError(f"{wheel} is not a readable wheel: {e}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if created and not target.exists():  # nothing unpacked: no cache folder left behind either
            with contextlib.suppress(OSError):
                target.parent.rmdir()
    return target


def version_of(site: Path) -> str:
    """`__version__` of the `diffusers/` package in `site`."""
    init = site / "diffusers" / "__init__.py"
    match = VERSION_LINE.search(init.read_text(encoding="utf-8"))
    if not match:
        raise LabError(f"{init} does not set __version__.")
    return match[1]


def resolve(spec: str) -> Diffusers:
    """The diffusers that SPEC names (see the module docstring); a clear UsageError when it names none."""
    path = Path(spec).expanduser()
    if path.suffix == ".whl" and path.is_file():
        site = unpack(path)
        return Diffusers(spec, version_of(site), site, f"wheel {path}")
    if path.is_dir():
        for site, kind in ((path / "src", "checkout"), (path, "site-packages")):
            if (site / "diffusers" / "__init__.py").is_file():
                return Diffusers(spec, version_of(site), site.resolve(), f"{kind} {path.resolve()}")
        raise UsageError(f"{path} holds no diffusers: a checkout has src/diffusers/, a site-packages folder diffusers/.")
    version = _version(spec)
    if version is None:
        raise UsageError(f"`{spec}` names no diffusers: give a release (0.38.0), a checkout or site-packages folder, "
                         "or a wheel file.")
    here = installed()
    if Version(here.version) == version:
        return dataclasses.replace(here, spec=spec)
    wheel = find_wheel(spec)
    return Diffusers(spec, str(version), unpack(wheel), f"release wheel {wheel}")


def module_source(wheel: Path, path: str) -> str | None:
    """The text of `diffusers/...py` (a path inside the package) in a release wheel; None when it has no such file."""
    try:
        with zipfile.ZipFile(wheel) as z:
            return z.read(path).decode("utf-8")
    except KeyError:
        return None

"""The lab installs the ordinary way: `pip install .` builds a wheel with every package in it, and the installed
`lab` command works from any folder, writing nothing into the place it was installed from."""

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")  # a copy: building writes build/ and *.egg-info beside the sources
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("lab", "fixes", "scenarios"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.glob("diffusers_fix_lab-*.whl")
    return path


def test_the_wheel_holds_every_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(p.parent.relative_to(ROOT).as_posix() for top in ("lab", "fixes", "scenarios")
                      for p in (ROOT / top).rglob("__init__.py"))
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, f"packages left out of the wheel: {missing}"
    modules = sorted(p.relative_to(ROOT).as_posix() for top in ("lab", "fixes", "scenarios")
                     for p in (ROOT / top).rglob("*.py"))
    assert [m for m in modules if m not in names] == []


@pytest.mark.slow
def test_the_installed_command_runs_from_another_folder(wheel, tmp_path):
    """A fresh virtual environment with only the wheel installed (its dependencies come from this environment's
    site-packages through a .pth file, which does not bring the editable install of the checkout along)."""
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lab = env_dir / "bin" / "lab"
    # the scenario catalog imports every scenario module from the wheel (`lab scenarios` would also build every
    # model on the meta device, 20 s here, which tells nothing more about the install)
    where = subprocess.run([str(python), "-c", "import lab, scenarios; from lab.run.scenario import catalog; "
                            "print(lab.__file__, scenarios.__file__, sorted(catalog()))"],
                           capture_output=True, text=True, cwd=elsewhere, check=True).stdout
    assert where.startswith(str(site)) and f" {site}/scenarios/" in where, f"not all from the installed wheel: {where}"
    assert "'wan'" in where and "'flux2'" in where
    helped = subprocess.run([str(lab), "--help"], capture_output=True, text=True, cwd=elsewhere)
    assert helped.returncode == 0 and "fixes" in helped.stdout, helped.stderr[-2000:]
    # as a module, two fixes' status (the catalog it looks them up in imports every fix module from the wheel)
    fixes = subprocess.run([str(python), "-m", "lab", "fixes", "--json", "unipc_stack", "hook_registry_cache"],
                           capture_output=True, text=True, cwd=elsewhere)
    assert fixes.returncode == 0, fixes.stderr[-2000:]
    assert "unipc_stack" in fixes.stdout and "hook_registry_cache" in fixes.stdout
    assert list(elsewhere.iterdir()) == []  # read-only commands write nothing where they run

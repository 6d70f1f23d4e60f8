"""Result files: a versioned JSON format with raw samples and the environment that produced them.

Format history:
- 1: first version (kind "ab": samples, stats, verify, profile deltas, environment, command).
- 2: verdicts read off one Hodges-Lehmann interval, fixed or sequential design (`lab.verdicts.stats`); `lab table --restat`
  upgrades a format-1 file by deciding its stored blocks again (`lab.results.restat`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from lab.base import files
from lab.base.errors import LabError
from lab.base.paths import checkout

FORMAT_VERSION = 2
#: environment keys that must match for two results to be compared
CHECKED = ("gpu", "torch", "diffusers", "cuda")


def lab_commit() -> str:
    """The lab's git commit (`LAB_COMMIT` overrides it, for copies of the tree without .git, e.g. a GPU box)."""
    if os.environ.get("LAB_COMMIT"):
        return os.environ["LAB_COMMIT"]
    root = checkout()
    if root is None:  # an installed wheel: its version
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"diffusers-fix-lab {version('diffusers-fix-lab')}"
        except PackageNotFoundError:
            return "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(device: str) -> dict[str, Any]:
    import diffusers
    import torch

    env = {
        "device": device,
        "gpu": None, "driver": None, "cuda": None,
        "torch": torch.__version__, "diffusers": diffusers.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "lab_commit": lab_commit(),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            env["driver"] = None
    else:
        env["gpu"] = "none (CPU)"
    return env


def build_of(result: dict) -> str:
    """How a result's pipeline was built: "faithful" (as from_pretrained + .to builds it), "pretrained" (a real
    checkpoint), or "old" for results made before the lab recorded it (every tensor made on the device in the
    scenario dtype: plain tensors on the wrong device, `_keep_in_fp32_modules` ignored)."""
    return result.get("build") or "old"


def check_compatible(a: dict, b: dict, allow: bool = False) -> None:
    """Refuse to compare results from different environments or builds unless `allow` (the explicit flag)."""
    if build_of(a) != build_of(b) and not allow:
        raise LabError(f"incompatible results, the pipelines were built differently: {a['name']} by the {build_of(a)} "
                       f"build, {b['name']} by the {build_of(b)} build. Pass --allow-mixed to compare anyway.")
    for key in CHECKED:
        if a["environment"].get(key) != b["environment"].get(key) and not allow:
            raise LabError(
                f"incompatible results, environment {key} is different: current={a['environment'].get(key)}, "
                f"other={b['environment'].get(key)} ({a['name']} vs {b['name']}). Pass --allow-mixed to compare anyway."
            )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write(path: Path, data: dict, replace: bool = False) -> None:
    if path.exists() and not replace:
        raise LabError(f"{path} already exists: pass --replace to overwrite it, or --name to write another.")
    files.write_text(path, json.dumps(data, indent=1, default=_default) + "\n")  # whole or not at all


def _default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def read(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LabError(f"{path}: not a readable result file ({e}).") from e
    version = data.get("format")
    if version == 1:
        raise LabError(f"{path}: result format 1 was decided by an older rule; run `lab table --restat` to decide "
                       "it again from its stored blocks.")
    if version != FORMAT_VERSION:
        raise LabError(f"{path}: result format version {version!r} not supported (this lab reads {FORMAT_VERSION}).")
    return data


#: what every result of a kind must hold for the pages to show it
REQUIRED = {"ab": ("name", "scenario", "fixes", "mode", "size", "steps", "environment", "verdict"),
            "sweep": ("scenario", "fixes", "key", "points", "environment"),
            "hunt": ("scenario", "fixes", "mode", "size", "steps", "environment")}


def all_results(directory: Path, kind: str = "ab") -> list[tuple[Path, dict]]:
    """Every result of `kind` under `directory`, read with the format check. A file that is not a readable result
    (truncated, empty, no `kind`, a key the pages need missing) is an error naming it, never left out silently."""
    out = []
    for path in sorted(Path(directory).glob("**/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise LabError(f"{path}: not a readable result file ({e}); restore it (`git checkout {path}`) or "
                           "measure it again.") from e
        if not isinstance(data, dict) or "kind" not in data:
            raise LabError(f"{path}: not a result file (no `kind`); results/ holds only the lab's results.")
        if data["kind"] != kind:
            continue
        missing = [k for k in REQUIRED.get(kind, ()) if k not in data]
        if missing:
            raise LabError(f"{path}: a result of kind `{kind}` without {', '.join(f'`{k}`' for k in missing)}; restore it "
                           f"(`git checkout {path}`) or measure it again.")
        out.append((path, read(path)))
    return out


def layers(result: dict) -> int | None:
    """The transformer blocks a result kept (`--layers`), or None for all of them; sweeps written before the result
    recorded `layers` itself have it only in their command."""
    if result.get("layers"):
        return result["layers"]
    m = re.search(r"--layers[ =](\d+)", result.get("command", ""))
    return int(m[1]) if m else None


def on_gpu(result: dict) -> bool:
    """Whether a result was measured on a CUDA device (its recorded environment says so)."""
    return result["environment"].get("device", "").startswith("cuda")

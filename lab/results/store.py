"""Result files: a versioned JSON format with raw samples and the environment that produced them, read into the
typed results of `lab.results.schema` (which keeps the format history) with the format check, and written whole.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from lab.base import files, host_memory
from lab.base.errors import LabError, UsageError
from lab.base.paths import checkout
from lab.results import schema
from lab.results.check import check_result
from lab.results.schema import FORMAT_VERSION, Environment, Result

#: the formats this lab reads (older typed formats are upgraded as they are read, `schema.upgrade`)
READABLE = (2, FORMAT_VERSION)
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


def _version(package: str) -> str | None:
    """The installed version of `package`, without importing it; None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def host_jobs() -> int | None:
    """How many campaign jobs were started to measure at once on this host (`LAB_HOST_JOBS`, which `lab campaign run`
    sets for its jobs), or None outside a campaign."""
    try:
        return int(os.environ["LAB_HOST_JOBS"]) or None
    except (KeyError, ValueError):
        return None


def environment(device: str, copy_rates: dict[str, float] | None = None) -> dict[str, Any]:
    """Where a result is measured: the device, its GPU and driver, the software, the host, and (on a GPU) the host's
    copy rates, which the run layer measures (`lab.run.copy_rates.rates`) and hands in."""
    import diffusers
    import torch

    env = {
        "device": device,
        "gpu": None, "driver": None, "cuda": None,
        "torch": str(torch.__version__), "diffusers": str(diffusers.__version__), "accelerate": _version("accelerate"),
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "lab_commit": lab_commit(), "host_jobs": host_jobs(), "copy_rates": copy_rates,
        "host_memory_gb": host_memory.total_gb(),
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


def _get(result: Result | dict, key: str, default=None):
    return result.get(key, default) if isinstance(result, dict) else getattr(result, key, default)


def _env(result: Result | dict) -> dict:
    env = _get(result, "environment") or {}
    return msgspec.structs.asdict(env) if isinstance(env, Environment) else env


def build_of(result: Result | dict) -> str:
    """How a result's pipeline was built: "faithful" (as from_pretrained + .to builds it), "pretrained" (a real
    checkpoint), or "old" for results made before the lab recorded it (every tensor made on the device in the
    scenario dtype: plain tensors on the wrong device, `_keep_in_fp32_modules` ignored)."""
    return _get(result, "build") or "old"


def check_compatible(a: Result | dict, b: Result | dict, allow: bool = False) -> None:
    """Refuse to compare results from different environments or builds unless `allow` (the explicit flag)."""
    name_a, name_b = _get(a, "name"), _get(b, "name")
    if build_of(a) != build_of(b) and not allow:
        raise LabError(f"incompatible results, the pipelines were built differently: {name_a} by the {build_of(a)} "
                       f"build, {name_b} by the {build_of(b)} build. Pass --allow-mixed to compare anyway.")
    env_a, env_b = _env(a), _env(b)
    for key in CHECKED:
        if env_a.get(key) != env_b.get(key) and not allow:
            raise LabError(
                f"incompatible results, environment {key} is different: current={env_a.get(key)}, "
                f"other={env_b.get(key)} ({name_a} vs {name_b}). Pass --allow-mixed to compare anyway."
            )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write(path: Path, result: Result | dict, replace: bool = False) -> None:
    """A result file, whole or not at all; a typed result as `schema.dump` gives it."""
    if path.exists() and not replace:
        raise LabError(f"{path} already exists: pass --replace to overwrite it, or --name to write another.")
    data = result if isinstance(result, dict) else schema.dump(result)
    files.write_text(path, json.dumps(data, indent=1, default=_default) + "\n")


def _default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    if hasattr(obj, "value"):  # an enum (a Verdict)
        return obj.value
    return str(obj)


def parse(path: Path) -> dict:
    """A result file's JSON, with the format check: never silently wrong, the file named in every error."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LabError(f"{path}: not a readable result file ({e}); restore it (`git checkout {path}`) or measure it "
                       "again.") from e
    if not isinstance(data, dict) or "kind" not in data:
        raise LabError(f"{path}: not a result file (no `kind`); results/ holds only the lab's results.")
    version = data.get("format")
    if version == 1:
        raise LabError(f"{path}: result format 1 was decided by an older rule; run `lab table --restat` to decide "
                       "it again from its stored blocks.")
    if version not in READABLE:
        raise LabError(f"{path}: result format version {version!r} not supported (this lab reads "
                       f"{', '.join(map(str, READABLE))}).")
    return data


def typed(path: Path, data: dict) -> Result:
    """The typed result of `data` (parsed from `path`), or an error that says which field is wrong."""
    try:
        return schema.load(data)
    except (msgspec.ValidationError, ValueError) as e:
        raise LabError(f"{path}: not a valid result of kind `{data.get('kind')}` ({e}); restore it "
                       f"(`git checkout {path}`) or measure it again.") from None


class Refused(UsageError):
    """A result file whose numbers contradict themselves (`lab.results.check`): bad input, named by file and field,
    which no reader publishes, decides again or goes on from."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path, self.problems = Path(path), problems
        super().__init__(f"{path}: refused, its numbers contradict themselves: {'; '.join(problems)}; restore it "
                         f"(`git checkout {path}`) or measure it again.")


def checked(path: Path, result: Result, *, derived: bool = True) -> Result:
    """`result` (read from `path`) once `lab.results.check` finds nothing wrong with it; else `Refused`."""
    problems = check_result(result, derived=derived)
    if problems:
        raise Refused(path, problems)
    return result


#: the state of `one_reading`: each file's result (or the error reading it gave) by its path, size and modification
#: time, and the files left out; None outside it
_reading: dict | None = None


@contextlib.contextmanager
def one_reading():
    """Within it, each result file is read once (kept by its path, size and modification time: a file written again
    is read again), and the readers pass over the files named to `leave_out`. For a command that reads the same
    results many times over and changes none of them (`lab table`): the readers share the objects it keeps."""
    global _reading
    before = _reading
    _reading = {"kept": {}, "left_out": set()}
    try:
        yield
    finally:
        _reading = before


def leave_out(paths: Iterable[Path]) -> None:
    """Inside `one_reading`: `all_results` passes over `paths` (refused files the caller has named to the user), and
    `left_out` says so to the readers that look for files themselves (a campaign's cells)."""
    if _reading is None:
        raise RuntimeError("leave_out is only for inside one_reading")
    _reading["left_out"] |= {Path(p).resolve() for p in paths}


def left_out(path: Path) -> bool:
    """Whether `path` is one of the files named to `leave_out` (never outside `one_reading`)."""
    return _reading is not None and Path(path).resolve() in _reading["left_out"]


def _kept(path: Path, what: str, make):
    """`make()`, inside `one_reading` once per file (by its path, size and modification time) and `what` ("parsed",
    "typed"), an error as well as a value."""
    if _reading is None:
        return make()
    stat = os.stat(path)
    key = (str(path), stat.st_size, stat.st_mtime_ns, what)
    kept = _reading["kept"].get(key)
    if kept is None:
        try:
            kept = make(), None
        except LabError as e:
            kept = None, e
        _reading["kept"][key] = kept
    if kept[1] is not None:
        raise kept[1]
    return kept[0]


def _parsed(path: Path) -> dict:
    return _kept(path, "parsed", lambda: parse(path))


def _typed(path: Path, data: dict) -> Result | dict:
    """The typed result of a parsed file, checked (`lab.results.check`); the JSON of a file of another kind."""
    if data["kind"] not in schema.TYPES:
        return data
    return _kept(path, "typed", lambda: checked(path, typed(path, data)))


def read(path: Path) -> Result | dict:
    """One result file: its typed result (`lab.results.schema`), checked (`lab.results.check`: `Refused` when its
    numbers contradict themselves); the JSON of a file of another kind (a benchmark's own record, such as the settings
    matrix)."""
    return _typed(path, _parsed(path))


def all_results(directory: Path, kind: str = "ab") -> list[tuple[Path, Result | dict]]:
    """Every result of `kind` under `directory`, read with the format check and `lab.results.check`. A file that is
    not a readable result (truncated, empty, no `kind`, a field missing or of the wrong type) or whose numbers
    contradict themselves is an error naming it, never left out silently (inside `one_reading`, the files it was told
    to leave out are passed over: the caller names them)."""
    out = []
    for path in files.written(sorted(Path(directory).glob("**/*.json"))):
        if left_out(path):
            continue
        data = _parsed(path)
        if data["kind"] == kind:
            out.append((path, _typed(path, data)))
    return out


def refusals(directories: Iterable[Path]) -> dict[Path, LabError]:
    """Every result file under `directories` that a reader would refuse (unreadable, mistyped, or numbers that
    contradict themselves), with the error that names it and the field."""
    out = {}
    for directory in directories:
        for path in files.written(sorted(Path(directory).glob("**/*.json"))):
            try:
                _typed(path, _parsed(path))
            except LabError as e:
                out[path] = e
    return out


def layers(result: Result | dict) -> int | None:
    """The transformer blocks a result kept (`--layers`), or None for all of them; sweeps written before the result
    recorded `layers` itself have it only in their command."""
    if _get(result, "layers"):
        return _get(result, "layers")
    m = re.search(r"--layers[ =](\d+)", _get(result, "command") or "")
    return int(m[1]) if m else None


def on_gpu(result: Result | dict) -> bool:
    """Whether a result was measured on a CUDA device (its recorded environment says so)."""
    return (_env(result).get("device") or "").startswith("cuda")

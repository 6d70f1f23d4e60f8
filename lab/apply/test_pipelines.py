"""The second stage of `lab upstream check` (`--test-pipelines`): the suite's tiny test pipelines of the touched
modules, run released and with the diff, and their outputs compared.

A test pipeline is a class of `tests/pipelines/**/test_*.py` that defines `get_dummy_components()` (the tiny
components) and names its `pipeline_class`; its `get_dummy_inputs()` gives the call. The ones that run
(:func:`select`) are those whose class body names a touched module's public class (`Lumina2Transformer2DModel` in the
components, `UniPCMultistepScheduler` as the scheduler) or whose `pipeline_class` a touched module defines, the latter
first, then by how often they name them, then by path. Each copy runs them in a process of its own
(`pipeline_probe.py`, copied beside the run as `lab_pipeline_probe.py`: it imports nothing of the lab), on CUDA where
torch finds it, else the CPU, and saves each output; :func:`compare` says whether the two are bit-identical, else
their largest absolute and relative differences.

Where the Hub cannot be reached (`--offline`), a tokenizer the components load by name is replaced by a stand-in
(a word-level tokenizer that maps every word to its unknown token), the same in both copies, and the comparison says
so; a component that needs the Hub otherwise (a text encoder's config) makes that pipeline `could not run`.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

#: the words a comparison uses
IDENTICAL, DIFFERS, NOT_RUN = "bit-identical", "differs", "could not run"


class Compared(msgspec.Struct, kw_only=True):
    """One test pipeline's outputs, released against with the diff: `status` is `bit-identical`, `differs` (with
    `max_abs` and `max_rel`, the largest absolute difference and the largest relative one where the released value is
    not 0) or `could not run` (`reason` says why); `stand_ins`: what the run put in place of what needs the Hub."""

    test: str
    pipeline: str = ""
    status: str
    max_abs: float | None = None
    max_rel: float | None = None
    shape: list[int] = []
    dtype: str = ""
    device: str = ""
    reason: str = ""
    stand_ins: list[str] = []


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A test pipeline class: its file (`tests/...py`), class name, `pipeline_class`, and the touched names it uses."""

    file: str
    cls: str
    pipeline: str
    names: tuple[str, ...]
    own: bool

    @property
    def label(self) -> str:
        return f"{self.file}::{self.cls}"


def _pipeline_class(node: ast.ClassDef) -> str:
    for item in node.body:
        if isinstance(item, ast.Assign) and any(getattr(t, "id", "") == "pipeline_class" for t in item.targets):
            return getattr(item.value, "id", "")
        if isinstance(item, ast.FunctionDef) and item.name == "pipeline_class":  # a property
            for sub in ast.walk(item):
                if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Name):
                    return sub.value.id
    return ""


def select(root: Path, modules: Sequence) -> list[Candidate]:
    """The test pipelines under `root/tests/pipelines` built from the touched `modules` (`lab.apply.suites.Module`),
    best first (the module docstring's rule)."""
    classes = {c for m in modules for c in m.classes}
    if not classes:
        return []
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(c) for c in sorted(classes, key=len, reverse=True))
                         + r")(?!\w)")
    found = []
    for path in sorted((root / "tests" / "pipelines").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not pattern.search(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            if not any(isinstance(i, ast.FunctionDef) and i.name == "get_dummy_components" for i in node.body):
                continue
            pipeline = _pipeline_class(node)
            if not pipeline:
                continue
            hits = pattern.findall(ast.get_source_segment(text, node) or "")
            own = pipeline in classes
            if hits or own:
                found.append(Candidate(path.relative_to(root).as_posix(), node.name, pipeline,
                                       tuple(sorted(set(hits))), own))
    return sorted(found, key=lambda c: (not c.own, -len(c.names), c.file, c.cls))


def compare(before, after) -> tuple[str, float | None, float | None]:
    """Two outputs (numpy arrays): `bit-identical`, or `differs` with the largest absolute difference and the largest
    relative one (over the elements whose released value is not 0). Shapes or dtypes that differ are a difference
    without numbers. Pure."""
    import numpy as np

    if before.shape != after.shape or before.dtype != after.dtype:
        return DIFFERS, None, None
    if np.array_equal(before, after, equal_nan=True):
        return IDENTICAL, 0.0, 0.0
    a, b = before.astype(np.float64), after.astype(np.float64)
    delta = np.abs(a - b)
    nonzero = a != 0
    rel = float(np.max(delta[nonzero] / np.abs(a[nonzero]))) if nonzero.any() else None
    return DIFFERS, float(np.nanmax(delta)), rel


def _run(checkout: Path, chosen: Sequence[Candidate], out: Path, timeout: float, offline: bool,
         package: str) -> dict[str, dict]:
    """Each candidate built and called in `checkout`, in one process: its record by label (`status`, `reason`,
    `device`, `stand_ins`, and `output`, the saved array's path)."""
    out.mkdir(parents=True, exist_ok=True)
    probe = out / "lab_pipeline_probe.py"
    shutil.copy(Path(__file__).with_name("pipeline_probe.py"), probe)
    spec = out / "spec.json"
    spec.write_text(json.dumps([{"label": c.label, "file": c.file, "cls": c.cls} for c in chosen]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout / "src"), str(checkout), *filter(None, [env.get("PYTHONPATH")])])
    env.update(LAB_CHECK_SITE=str(checkout / "src"), LAB_CHECK_PACKAGE=package, PYTHONDONTWRITEBYTECODE="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    records: dict[str, dict] = {}
    try:
        done = subprocess.run([sys.executable, str(probe), str(spec), str(out)], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        problem = None if done.returncode == 0 else last
    except subprocess.TimeoutExpired:
        problem = f"stopped at its time limit, {timeout:g} s"
    results = out / "results.jsonl"
    if results.exists():
        for line in results.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            records[record["label"]] = record
    for c in chosen:
        records.setdefault(c.label, {"status": "error", "reason": problem or "no record"})
    return records


def compare_runs(chosen: Sequence[Candidate], released: Path, changed: Path, folder: Path, timeout: float,
                 offline: bool, package: str) -> list[Compared]:
    """`chosen` run in the `released` and the `changed` checkout, and each one's outputs compared."""
    import numpy as np

    runs = [_run(checkout, chosen, folder / f"pipelines-{i}", timeout, offline, package)
            for i, checkout in enumerate((released, changed))]
    found = []
    for c in chosen:
        before, after = runs[0][c.label], runs[1][c.label]
        common = {"test": c.label, "pipeline": c.pipeline, "device": after.get("device") or before.get("device", ""),
                  "stand_ins": sorted(set(before.get("stand_ins", [])) | set(after.get("stand_ins", [])))}
        bad = [(arm, r) for arm, r in (("released", before), ("with the diff", after)) if r["status"] != "ok"]
        if bad:
            arm, r = bad[0]
            found.append(Compared(status=NOT_RUN, reason=f"{arm}: {r.get('reason', '')}"[:500], **common))
            continue
        a, b = np.load(before["output"]), np.load(after["output"])
        status, max_abs, max_rel = compare(a, b)
        reason = "" if a.shape == b.shape and a.dtype == b.dtype else \
            f"released {a.dtype}{list(a.shape)}, with the diff {b.dtype}{list(b.shape)}"
        found.append(Compared(status=status, max_abs=max_abs, max_rel=max_rel, shape=list(b.shape), dtype=str(b.dtype),
                              reason=reason, **common))
    return found


def words(c: Compared) -> str:
    """One comparison in words, as a page quotes it."""
    if c.status == DIFFERS and c.max_abs is not None:
        rel = f", max rel {c.max_rel:.2g}" if c.max_rel is not None else ""
        return f"not bit-identical: max abs difference {c.max_abs:.2g}{rel}"
    if c.status == NOT_RUN:
        return f"could not run ({c.reason})"
    return c.status + (f" ({c.reason})" if c.reason else "")

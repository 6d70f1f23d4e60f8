"""What a campaign's plan rests on: the results and run logs already measured, read once per job (`read`), and what
one result says about a cell (pure: its calls' seconds, the base both its arms run, the blocks a run goes on from).

The estimates (`lab.campaigns.estimates`) read nothing: they are given a `Measured`, which `read` fills from a
results folder and a test writes out by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from lab.base import files, naming
from lab.base.errors import LabError
from lab.campaigns.cells import Cell, Job, device_of
from lab.results import store
from lab.results.states import RESUMABLE
from lab.verdicts import stats


@dataclasses.dataclass(frozen=True)
class Measured:
    """What an estimate of one job rests on: A/B results (each newest last) and run-log entries."""

    #: the A/B results of the job's pipeline, mode, size and setting (any fix set) that timed calls
    at_setting: tuple = ()
    #: the same in eager, for a compiled job: where nothing compiled was measured, their calls bound its own
    eager: tuple = ()
    #: the same mode and size without the job's setting, for a job in a setting nothing was measured in
    without_setting: tuple = ()
    #: seconds compiling took in each compiled A/B of the pipeline (both arms' first calls)
    compile_s: tuple[float, ...] = ()
    #: the entries of every campaign's run log (one finished job each)
    log: tuple[dict, ...] = ()
    #: the first cell's own newest result on the device, for a calibration or a history (their trials or pairs)
    own: Any = None


def read(job: Job, results: Path, device: str | None = None) -> Measured:
    """What `estimate` needs of `results` for `job`, on `device` (`h100`; None: any)."""
    first = job.cells[0]
    if first.kind != "ab":
        own = own_result(first, results, device) if first.kind in ("calibrate", "history") else None
        return Measured(log=tuple(run_logs(results)), own=own)
    return Measured(at_setting=tuple(similar(first, results)),
                    eager=tuple(similar(first, results, mode="eager")) if first.mode == "compile" else (),
                    without_setting=tuple(similar(first, results, setting=False)) if first.option("setting") else (),
                    compile_s=tuple(compile_seconds(first.pipeline, results)) if first.mode == "compile" else ())


def read_log(path: Path) -> list[dict]:
    """The run log of a campaign (one JSON object per finished job); a line cut off by a kill is skipped."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def run_logs(results: Path) -> list[dict]:
    """The entries of every campaign's run log under `results` (`campaigns/*.jsonl`), file by file."""
    return [entry for path in sorted((results / "campaigns").glob("*.jsonl")) for entry in read_log(path)]


def similar(cell: Cell, results: Path, *, setting: bool = True, mode: str | None = None) -> list:
    """Measured A/B results of the same pipeline, mode (or `mode`) and size (any fix set), newest last (a file that
    cannot be read tells nothing about the time: `lab campaign plan` names it where it is a cell's result); with
    `setting` False, those without the cell's setting."""
    folder = results / "ab" / cell.pipeline
    size = cell.size_tag() if setting else naming.size_tag(
        cell.size, cell.option("layers"), cell.option("call"), cell.option("steps"),
        decode=bool(cell.option("full_decode")))
    found = []
    for path in files.newest_last(files.written(folder.glob(f"*__{mode or cell.mode}__{size}__*.json"))):
        try:
            result = store.read(path)
        except LabError:
            continue
        if not isinstance(result, dict) and result.kind == "ab" and (
                (result.timed and result.samples.control.raw_wall_ms) or (result.phase_s or {}).get("call")):
            found.append(result)
    return found


def compile_seconds(pipeline: str, results: Path) -> list[float]:
    """Seconds compiling took in each compiled A/B of `pipeline` under `results` that recorded it (both arms' first
    calls, `compilation`)."""
    seconds = []
    for path in files.written((results / "ab" / pipeline).glob("*__compile__*.json")):
        try:
            compiled = getattr(store.read(path), "compilation", None)
        except LabError:
            continue
        if compiled and compiled.get("control"):
            seconds.append(sum((compiled.get(arm) or {}).get("compile_s") or 0.0 for arm in ("control", "test")))
    return seconds


def own_result(cell: Cell, results: Path, device: str | None):
    """The newest result of `cell` measured on `device` (any device where None); None where there is none or it
    cannot be read."""
    found = [p for p in cell.results_found(results, device or "*")
             if device is None or device_of(p.stem) == device]
    try:
        return store.read(found[-1]) if found else None
    except LabError:
        return None


def resumable_blocks(path: Path) -> int:
    """`blocks_to_go_on_from` the result at `path`; 0 where there is none or it cannot be read."""
    try:
        return blocks_to_go_on_from(store.read(path)) if path.exists() else 0
    except LabError:
        return 0


# --- what one result says (pure) ----------------------------------------------------------------------------------


def blocks_to_go_on_from(result) -> int:
    """How many timing blocks an A/B result holds that a run on its GPU can go on from (its sequential design stopped
    undecided: `lab ab --resume`); 0 for any other result."""
    if result is None or isinstance(result, dict) or result.kind != "ab" or result.stopped not in RESUMABLE:
        return 0
    return len(result.order or [])


def call_s(result, arm: str = "control") -> float:
    """Seconds of one timed call of an A/B result's control arm (or `arm`; the median of its calls), or of one plain
    call as its verification took them (`phase_s["call"]`) where it timed no block. The control arm runs what another
    cell of the same setting and base runs without its fix; the test arm may be several times faster (an offload fix
    in an offloading setting), and the median of both arms' calls would fall between the two, a call time no arm
    had."""
    calls = getattr(result.samples, arm).raw_wall_ms if result.timed else None
    if calls:
        return stats.median([x for b in calls for x in b]) / 1e3
    return result.phase_s["call"]


def base_of(stem: str) -> str:
    """The fixes both arms of an A/B run (`a+b-over-c`: `c`), from its result's or cell's stem; "" for none."""
    return stem.split("__")[0].partition("-over-")[2]


def of_cell(result, cell: Cell) -> bool:
    """Whether `result` is one of `cell` (its name but the GPU's): not one of the same fixes in the other mode, say."""
    return result.name.rpartition("__")[0] == cell.stem("*").rpartition("__")[0]


def part_of(result, cell: Cell) -> bool:
    """Whether A/B `result` timed a part of `cell`'s fixes and no other: some of them, or a fix one of them includes
    (`Fix.includes`: `group_offload_pinned` makes `group_offload_keep_host`'s change and more), over the same base.
    Its change is one the cell makes too."""
    from lab.apply.fix import catalog  # (the catalog's fixes only: a campaign's cell names no other)

    fixes = catalog()
    held = set(cell.fixes) | {n for f in cell.fixes if f in fixes for n in fixes[f].includes}
    return set(result.base) == set(cell.base) and set(result.fixes) < held and set(result.fixes) != set(cell.fixes)


def calls_per_block(cell: Cell) -> int:
    """Calls one timing block of `cell` makes: its lead-in, then `repeat` timed calls per arm, each after its
    warm-up calls."""
    lead_in, repeat, warmup = (cell.option(k, d) for k, d in (("lead_in", 1), ("repeat", 2), ("warmup", 0)))
    return lead_in + 2 * repeat * (1 + warmup)


def unrun_in(cell: Cell, seen: list):
    """The newest of the A/B results `seen` whose verifying call ran none of `cell`'s fixes, all of which it holds."""
    for result in reversed(seen):
        ran = result.verify.exercised if result.verify else {}
        if ran and all(ran.get(fix, 1) == 0 for fix in cell.fixes):
            return result
    return None


def changed_beyond(result, margin: float) -> bool:
    """Whether A/B `result` decided a change of speed larger than `margin`: its interval wholly outside +-margin (a
    change within it takes as many blocks to find as none). Such fixes are unlikely to change nothing beside others
    or in the other mode, and a cell of them decides sooner than a cell of no effect."""
    if result.stats is None or not result.verdict.changed_speed:
        return False
    low, high = result.stats.ci
    return not (1 - margin <= high and low <= 1 + margin)

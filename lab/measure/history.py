"""`lab history`: the same call on a list of diffusers releases, each against one reference release (asv-style).

The reference runs in one worker process for the whole history; each other release gets a worker of its own, and
the pair is an ordinary A/B of two diffusers (`lab.measure.ab.run`, outputs that differ are timed and flagged): its result
goes to `results/ab/<scenario>/diffusers-<ref>-to-<release>__...` with its page, so every row of the history links
to the full evidence. A release whose diffusers lacks the scenario's pipeline class is skipped with a note; a pair
that already has a result is kept (a history cut off resumes), unless `replace`, or unless it was made by another
build, with another pairing of the worker processes, or cut short (`owed`): those are measured again. Under a
campaign's time limit no pair starts that would end past it; the releases not reached get rows that say so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import Version

from lab import results
from lab.base import naming
from lab.base.errors import LabError
from lab.measure import ab, blocks, cell
from lab.results.schema import ABResult, HistoryRow
from lab.run.description import Run
from lab.run.scenario import MissingClass
from lab.run.worker import IsolatedArm

#: the trace metrics a history row keeps (keys of a result's `profile.metrics`)
METRICS = ("syncs", "syncs_per_step", "host_scalar_reads", "memcpy_HtoD", "cpu_gaps_total_us", "gpu_idle_us",
           "launches_per_step")


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every pair of a history shares: the scenario, its build, compilation and timing, and where it goes."""

    scenario: Any
    run: Run  # what every worker builds, and how it compiles (`lab.run.description.Run`)
    config: ab.ABConfig
    size_tag: str
    device_tag: str
    ab_dir: Path
    trace_dir: Path
    command: str
    replace: bool = False


def row(entry: dict, result: ABResult, path: Path, status: str = "measured") -> HistoryRow:
    """A history row (`entry`: the release's version and origin) from one pair's A/B result."""
    s = result.stats
    metrics = (result.profile or {}).get("metrics") or {}
    decided = s.decided_interval() if s else (None, None)
    v = result.verify
    return HistoryRow(
        **entry, status=status, result=str(path), verdict=result.verdict, equivalent=bool(s and s.equivalent),
        summary=result.summary, ratio=s.ratio if s else None, ci=s.ci if s else None, level=s.level if s else None,
        decided_ci=decided[0], decided_level=decided[1], blocks=s.n if s else None,
        control_ms=s.control_median if s else None, test_ms=s.test_median if s else None,
        metrics={k: {"control": metrics[k]["control"], "test": metrics[k]["test"]} for k in METRICS if k in metrics},
        identical=v.identical if v else None, max_abs_diff=v.max_abs_diff if v else None, warnings=result.warnings,
        interrupted=_cut_short(result), processes=result.process_design)


def _cut_short(result: ABResult) -> bool:
    """Whether a pair's blocks were stopped before its rule decided by a Ctrl-C or a campaign's time limit."""
    return result.interrupted or result.stopped in ("time limit", "interrupted")


def owed(result: ABResult, setting: Setting) -> str | None:
    """Why a pair's existing result is measured again rather than kept (None: kept): it was made by another build
    (the lab's old build), with another pairing of its worker processes (one pair for all blocks, the design before
    fresh pairs), or cut short (a Ctrl-C, or a campaign's time limit)."""
    why = []
    build, wanted = results.build_of(result), setting.run.build_kind
    if build != wanted:
        why.append(f"its pipelines were made by the {build} build, this history's by the {wanted} build")
    design = result.process_design or "one process"
    pairing = "one pair" if setting.config.one_pair else "fresh pair per block"
    if design != pairing:
        why.append(f"it was measured with {design}, this history with {pairing}")
    if _cut_short(result):
        why.append("it was cut short (a Ctrl-C or a time limit)")
    return "; ".join(why) or None


def past_limit(took: list[float], deadline: float | None, now: float) -> bool:
    """Whether the next pair, if it takes as long as the longest so far (`took`, seconds), would end within
    `blocks.DEADLINE_MARGIN_S` of a campaign's time limit (`deadline`, as `time.time()`); never before a first pair."""
    return deadline is not None and bool(took) and now + max(took) + blocks.DEADLINE_MARGIN_S > deadline


def _not_reached(versions: list, reference: Any, why: str) -> list[HistoryRow]:
    """Rows for the releases a stopped history did not get to (the reference keeps its own row)."""
    return [HistoryRow(version=d.version, origin=d.origin, status="not reached", why=why) if d.version !=
            reference.version else HistoryRow(version=d.version, origin=d.origin, status="reference")
            for d in versions]


def measure(setting: Setting, versions: list, reference: Any, progress: Callable[[str], None]) -> list[HistoryRow]:
    """One row per release, oldest first: the reference's own row, then each release against it."""
    rows: list[HistoryRow] = []
    took: list[float] = []  # seconds of each pair this run measured (a campaign's time limit starts none past it)
    control: IsolatedArm | None = None
    ordered = sorted(versions, key=lambda d: Version(d.version))
    try:
        for k, d in enumerate(ordered, 1):
            entry = {"version": d.version, "origin": d.origin}
            if d.version == reference.version:
                rows.append(HistoryRow(**entry, status="reference"))
                continue
            name = naming.ab_name([naming.diffusers_tag(reference.version, d.version)], setting.run.compile.mode,
                                  setting.size_tag, setting.device_tag)
            where = cell.paths(setting.ab_dir, setting.scenario.name, name)
            progress(f"\n[{k}/{len(ordered)}] diffusers {d.version} against {reference.version}")
            if not cell.plan(where, replace=setting.replace).run:
                kept = results.read(where["json"])
                why = owed(kept, setting)
                if why is None:
                    progress(f"kept {where['json']} (it exists; --replace measures it again)")
                    rows.append(row(entry, kept, where["json"], status="kept"))
                    continue
                progress(f"measuring {where['json']} again: {why}")
            if past_limit(took, blocks.time_limit(), time.time()):
                progress(f"stopped before diffusers {d.version}: its pair would end past the campaign's time limit "
                         f"(the longest pair so far took {max(took):.0f} s); the next run goes on from here")
                rows += _not_reached(ordered[k - 1:], reference, "the campaign's time limit came first")
                break
            started = time.time()
            if control is None:
                progress(f"starting the reference worker (diffusers {reference.version}) ...")
                control = IsolatedArm("control", [], setting.run, diffusers=reference)
            try:
                test = IsolatedArm("test", [], setting.run, diffusers=d)
            except MissingClass as e:
                progress(f"skipped diffusers {d.version}: {e}")
                rows.append(HistoryRow(**entry, status="skipped", why=str(e)))
                continue
            except LabError as e:  # this release does not run here (an import error, say): the others still do
                progress(f"ERROR: diffusers {d.version}: {e}")
                rows.append(HistoryRow(**entry, status="failed", why=str(e)))
                continue
            try:
                outcome = ab.run(None, setting.run.compile, control, test, setting.config, setting.trace_dir,
                                 f"{setting.scenario.name}_{name}", progress, time_differing=True)
            except LabError as e:
                progress(f"ERROR: diffusers {d.version}: {e}")
                rows.append(HistoryRow(**entry, status="failed", why=str(e)))
                continue
            finally:
                test.close()
            result = ab.record(name=name, command=setting.command, scenario=setting.scenario, run=setting.run,
                               config=setting.config, arms=(control, test), fixes=[], control="off", notes=[],
                               isolated=True, outcome=outcome,
                               diffusers={"control": reference.to_dict(), "test": d.to_dict()})
            written = cell.write(result, where, setting.trace_dir, went_on=False, progress=progress)
            progress(f"diffusers {d.version}: {result.verdict_text} — {result.summary}")
            rows.append(row(entry, result, written["json"]))
            took.append(time.time() - started)
            if _cut_short(result):  # this pair keeps its blocks; the history
                rows += _not_reached(ordered[k:], reference,  # stops here, and the next run measures it again
                                     "the history stopped at the pair before (a Ctrl-C or a time limit)")
                break
    except MissingClass as e:
        raise LabError(f"the reference diffusers {reference.version} cannot build `{setting.scenario.name}`: {e}") from None
    finally:
        if control is not None:
            control.close()
    _reference_metrics(rows)
    return rows


def _reference_metrics(rows: list[HistoryRow]) -> None:
    """The reference row's trace metrics and call time: the control arm's, from the first pair that measured them."""
    ref = next((r for r in rows if r.status == "reference"), None)
    pair = next((r for r in rows if r.metrics or r.control_ms), None)
    if ref is not None and pair is not None:
        ref.metrics = {k: {"control": v["control"], "test": v["control"]} for k, v in (pair.metrics or {}).items()}
        ref.test_ms = ref.control_ms = pair.control_ms
        ref.ratio = 1.0

"""The typed results: what `lab ab`, `sweep`, `hunt`, `history`, `census`, `calibrate` and `profile --report` write, as
msgspec structs.

The structs live by what they describe: `header` (what every result starts with), `conditions` (where and how it
was measured), `verification` (the verifying calls), `outcome` (timings and the statistics a verdict was read off),
and one module per kind of result: `comparisons` (`ABResult`, `SweepResult`), `profiled` (`HuntResult`,
`CensusResult`, `OverheadReport`), `history` (`HistoryResult`), `calibration` (`CalibrationResult`). This module
holds the format history, the upgrade of older files and the file's round trip, and names every struct, so that a
caller imports them all from `lab.results.schema`.

A result file is JSON; :func:`load` turns its parsed content into one of these structs (checking every field's type,
upgrading older formats first), :func:`dump` turns a struct back into the JSON the file holds. Readers use
attributes (`result.verdict`, `result.stats.ratio`); only the bulky trace metrics of a profile (`profile`,
`compilation`, a hunt's `sites`, an overhead report's analysis) stay plain dicts, as the trace analysis makes them.

Format history (`FORMAT_VERSION`):
- 1: first version (kind "ab": samples, stats, verify, profile deltas, environment, command).
- 2: verdicts read off one Hodges-Lehmann interval, fixed or sequential design (`lab.verdicts.stats`); `lab table
  --restat` upgrades a format-1 file by deciding its stored blocks again (`lab.results.restat`).
- 3: the verdict is a value of :class:`~lab.verdicts.verdict.Verdict` ("faster"), no longer its words ("faster,
  within ±1%": the words come from the value and the statistics' equivalence). A format-2 file is upgraded as it is
  read (:func:`upgrade`); it is rewritten only by `lab table --restat`.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from lab.results.calibration import AASummary, CalibrationResult, CalibrationTrial, CalibrationTrials, PositiveSummary
from lab.results.comparisons import ABResult, SweepPoint, SweepResult
from lab.results.conditions import CompileOptions, Environment, Segment, Timing, Workers
from lab.results.header import FORMAT_VERSION
from lab.results.history import HistoryResult, HistoryRow
from lab.results.outcome import ArmSamples, Bound, Look, OffloadLimits, Samples, Stats
from lab.results.profiled import CENSUS_INTERRUPTED, CensusArm, CensusResult, HuntResult, OverheadReport
from lab.results.settings_map import SettingPoint, SettingsMapResult
from lab.results.verification import ChangedLines, CompilerRounding, Numerics, Verify
from lab.verdicts.verdict import Verdict

__all__ = ["AASummary", "ABResult", "ArmSamples", "Bound", "CalibrationResult", "CalibrationTrial",
           "CalibrationTrials", "CENSUS_INTERRUPTED", "CensusArm", "CensusResult", "ChangedLines", "CompileOptions",
           "CompilerRounding", "dump", "Environment", "FORMAT_VERSION", "HistoryResult", "HistoryRow", "HuntResult",
           "load", "Look", "Numerics", "OffloadLimits", "OverheadReport", "PositiveSummary", "replace", "Result",
           "Samples", "Segment", "SettingPoint", "SettingsMapResult", "Stats", "SweepPoint", "SweepResult", "Timing",
           "TYPES", "upgrade", "Verify", "Workers"]


Result = Union[ABResult, SweepResult, HuntResult, HistoryResult, CensusResult, CalibrationResult, OverheadReport,
               SettingsMapResult]
#: the struct of each kind
TYPES: dict[str, type] = {"ab": ABResult, "sweep": SweepResult, "hunt": HuntResult, "history": HistoryResult,
                          "census": CensusResult, "calibration": CalibrationResult, "overhead": OverheadReport,
                          "settings-map": SettingsMapResult}


def _verdict(text: str | None) -> str | None:
    return None if text is None else Verdict.from_text(text).value


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A format-2 result as format 3 (in place): each verdict's words become its value."""
    if data.get("format") != 2:
        return data
    if data.get("kind") == "ab" and "verdict" in data:
        data["verdict"] = _verdict(data["verdict"])
    for point in data.get("points") or () if data.get("kind") == "sweep" else ():
        if isinstance(point, dict) and "verdict" in point:
            point["verdict"] = _verdict(point["verdict"])
    for row in data.get("releases") or () if data.get("kind") == "history" else ():
        if not isinstance(row, dict):
            continue
        if row.get("verdict") == "reference" or row.get("status") == "reference":
            row.pop("verdict", None)  # the status says it
        elif row.get("verdict"):
            row["equivalent"] = "within" in row["verdict"]
            row["verdict"] = _verdict(row["verdict"])
    data["format"] = FORMAT_VERSION
    return data


def load(data: dict[str, Any]) -> Result:
    """The struct of a result file's parsed JSON (of a typed kind), its format upgraded first. Raises
    `msgspec.ValidationError` (what is wrong, and where: `$.stats.ci`) or `ValueError` (an unknown verdict)."""
    kind = data.get("kind")
    if kind not in TYPES:
        raise ValueError(f"kind {kind!r} has no typed result (typed: {', '.join(TYPES)})")
    return msgspec.convert(upgrade(data), TYPES[kind])


def dump(result: Result) -> dict[str, Any]:
    """The JSON-ready content of a result file: every field, those at their defaults too."""
    out = msgspec.to_builtins(result, enc_hook=_builtin)
    return {"format": result.format, "kind": result.kind, **out}  # always written, though they are the defaults


def _builtin(obj: Any) -> Any:
    """What the trace analysis may leave in a profile: numpy scalars and arrays, str subclasses (torch's version)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"a result cannot hold {type(obj).__name__}")


def replace(result: Result, **changes: Any) -> Result:
    return msgspec.structs.replace(result, **changes)

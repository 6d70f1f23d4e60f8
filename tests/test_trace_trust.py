"""A trace is not taken at its word: overlapping annotation spans give no negative CPU gap, starts too large for a
float keep their nanoseconds, and two traces of different devices or modes say so when compared. Each case edits a
copy of a real trace in `tests/data/traces/`."""

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from lab.traces.analysis import analyze, compare, cpu_gap_analysis
from lab.traces.gaps import windows
from lab.traces.trace import load

DATA = Path(__file__).resolve().parent / "data" / "traces"
CPU = DATA / "sd35_tiny_cpu.json.gz"  # eager, CPU only, four `transformer_forward` spans
H200 = DATA / "sd35_h200_shapes.json.gz"  # eager, one H200


def _events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def _calls(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("name") == "transformer_forward" and e.get("ph") == "X"),
                  key=lambda e: e["ts"])


def test_overlapping_transformer_spans_give_no_negative_gap_and_are_reported(tmp_path):
    events = _events(CPU)
    calls = _calls(events)
    third_end = calls[2]["ts"] + calls[2]["dur"]
    calls[1]["dur"] = third_end + 100.0 - calls[1]["ts"]  # the second span now holds the third whole, and 100 µs more
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load(path)
    gaps = cpu_gap_analysis(trace)
    assert min(gaps["gaps_us"]) >= 0 and gaps["overlaps"] == 1 and gaps["count"] == 2
    ends = [c["ts"] + c["dur"] for c in calls]
    expected = (calls[1]["ts"] - ends[0]) + (calls[3]["ts"] - ends[1])  # the third leaves no gap of its own
    assert gaps["total_us"] == pytest.approx(expected, abs=0.01)
    reach = f"{(ends[1] - calls[2]['ts']) / 1000:,.3f}"
    result = analyze(trace)
    assert any(f"1 `transformer_forward` span(s) start before the one before ended (by up to {reach} ms" in line
               for line in result["trace_checks"]), result["trace_checks"]
    found, _ = windows(trace, sources=("cpu gap",))
    assert all(w["end"] > w["start"] for w in found) and len(found) == 2


def test_starts_past_two_to_the_43_microseconds_keep_their_nanoseconds(tmp_path):
    events = [e for e in _events(CPU) if e.get("ph") in ("X", "i")][:400]
    offset = Decimal(2**44)  # float spacing 2^-8 µs here: a start 1 ns on rounds back onto its neighbour
    op = next(e for e in events if e.get("cat") == "cpu_op")
    twin = dict(op, ts=op["ts"] + 0.001)  # the same op 1 ns later: a distinct event, no duplicate
    events.append(twin)
    digits = {}
    for k, e in enumerate(events):
        digits[k] = str(Decimal(repr(e["ts"])) + offset)
        e["ts"] = f"@{k}@"
    text = json.dumps({"traceEvents": events})
    for k, value in digits.items():
        text = text.replace(f'"@{k}@"', value)
    path = tmp_path / "late.json"
    path.write_text(text)
    trace = load(path)
    assert trace.checks.dropped == {}, trace.checks.dropped  # the twin is not taken for a duplicate
    assert trace.checks.exact_starts == len(events)
    assert any("start(s) past 2^43 µs read exactly" in line for line in trace.checks.lines())
    ops = trace.cat("cpu_op")
    first, second = (int(Decimal(digits[k]) * 1000) for k in (events.index(op), len(events) - 1))
    assert first in ops.ts.tolist() and second in ops.ts.tolist() and second - first == 1


def test_an_ordinary_trace_reads_its_starts_as_before():
    trace = load(CPU)
    assert trace.checks.exact_starts == 0 and not any("2^43" in line for line in trace.checks.lines())
    expected = sorted(round(e["ts"] * 1000) for e in _events(CPU) if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    assert sorted(trace.cat("cpu_op").ts.tolist()) == expected


def test_comparing_traces_of_two_devices_says_so():
    out = compare(load(H200), load(CPU))
    assert any("different devices (control: NVIDIA H200, test: the CPU alone)" in w for w in out["warnings"])
    assert not any("compiled" in w for w in out["warnings"])  # both eager
    assert compare(load(CPU), load(CPU))["warnings"] == []


@pytest.mark.slow
def test_lab_analyze_warns_when_an_h200_compiled_trace_meets_a_cpu_eager_one(real_trace, capsys):
    from lab import cli

    assert cli.main(["analyze", str(real_trace), str(CPU)]) == 0
    out = capsys.readouterr().out.splitlines()
    warnings = [line for line in out if line.startswith("WARNING: ")]
    assert any("different devices (control: NVIDIA H200, test: the CPU alone)" in w for w in warnings), out[:5]
    assert any("control is compiled, test eager" in w for w in warnings), out[:5]
    assert out.index(warnings[-1]) < out.index(next(line for line in out if line.startswith("control: ")))

"""`lab analyze` never trusts a trace it cannot use: what is wrong is left out with counts, or is one error."""

import gzip
import json

import pytest

from lab.base.errors import LabError
from lab.traces.trace import load
from tests.conftest import lab_here


def _events():
    """A small trace of the shape torch.profiler writes: CPU ops on one thread, kernels on a stream, a flow."""
    ops = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{k}", "pid": 1, "tid": 7, "ts": 1000.0 + 10 * k, "dur": 5.0,
            "args": {"correlation": k}} for k in range(6)]
    kernels = [{"ph": "X", "cat": "kernel", "name": f"k{k}", "pid": 0, "tid": 7, "ts": 1003.0 + 10 * k, "dur": 4.0,
                "args": {"correlation": k, "stream": 7, "device": 0}} for k in range(6)]
    flows = [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": k, "pid": 1, "tid": 7, "ts": 1000.0 + 10 * k}
             for k in range(6)]
    return ops + kernels + flows + [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]


def _write(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_clean_trace_reports_only_the_phases_it_does_not_read(tmp_path, real_trace):
    checks = load(_write(tmp_path, _events())).checks
    assert checks.dropped == {} and checks.zero_length == 0 and checks.other_phases == {"s": 6, "M": 1}
    real = load(real_trace).checks  # the committed H200 trace: flows and metadata only
    assert real.dropped == {} and real.zero_length == 0 and set(real.other_phases) == {"f", "s", "M"}


def test_unusable_events_are_left_out_and_counted(tmp_path):
    events = _events()
    events[0]["dur"] = -5.0  # a negative duration
    events[1]["ts"] = -1.0  # a negative start
    events[2]["ts"] = 1000.0 + 3 * 86400e6  # three days later: a wrapped clock
    events.append(dict(events[3]))  # an exact duplicate
    events[4]["dur"] = 0.0  # zero length: kept
    trace = load(_write(tmp_path, events))
    assert trace.checks.dropped == {"a negative start time": 1, "a negative duration": 1,
                                    "a start a day or more from the rest of the trace (a wrapped or mixed clock)": 1,
                                    "an exact duplicate of another event": 1}
    assert trace.checks.zero_length == 1
    assert len(trace.cat("cpu_op")) == 3 and len(trace.cat("kernel")) == 6  # ops 3, 4 and 5 remain
    assert (trace.cat("cpu_op").dur >= 0).all()


def test_a_trace_with_nothing_usable_is_an_error_naming_the_file(tmp_path):
    events = [dict(e, dur=-1.0) for e in _events() if e["ph"] == "X"]
    path = _write(tmp_path, events)
    with pytest.raises(LabError, match=f"{path}: no usable complete .* left out 12 complete event"):
        load(path)
    flows_only = _write(tmp_path, [e for e in _events() if e["ph"] != "X"], "flows.json")
    with pytest.raises(LabError, match="no usable complete"):
        load(flows_only)
    other = _write(tmp_path, [{"ph": "X", "cat": "user_annotation", "name": "x", "pid": 1, "tid": 1, "ts": 1.0,
                               "dur": 1.0}], "other.json")
    with pytest.raises(LabError, match="neither CPU operators .* nor GPU kernels"):
        load(other)


def test_lab_analyze_says_what_it_left_out_and_never_ends_in_an_internal_error(tmp_path):
    events = _events()
    events[0]["dur"] = -5.0
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    proc = lab_here("analyze", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Trace checks: left out 1 complete event(s): a negative duration" in proc.stdout
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": [dict(e, dur=-1.0) for e in _events() if e["ph"] == "X"]}))
    proc = lab_here("analyze", str(empty))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1  # a bad input: one line, exit 2
    assert f"{empty}: no usable complete ('X') event" in proc.stderr and "Full traceback" not in proc.stderr

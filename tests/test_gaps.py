"""Gap attribution: what the host did between transformer calls and while the GPU sat idle, on a synthetic trace
of known contents, on the real shared H200 trace, and in a lab trace before and after a fix."""

import json

import pytest

from lab.traces.analysis import analyze, compare
from lab.traces.gaps import attribute, folded_text, moved
from lab.traces.trace import load


def _event(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _py(name, ts, dur, pid, parent):
    return _event("python_function", name, ts, dur, **{"Python id": pid, "Python parent id": parent})


@pytest.fixture
def synthetic(tmp_path):
    """Two steps; a 100 µs CPU gap within step 0 (f 80 µs, calling g 30 µs) and a 400 µs gap between the steps (h
    300 µs); GPU idle 170 µs inside step 0 and 430 µs across the step boundary."""
    ev = [_event("user_annotation", "denoise_step_0", 0, 1000), _event("user_annotation", "denoise_step_1", 1000, 1000),
          _event("user_annotation", "transformer_forward", 0, 300), _event("user_annotation", "transformer_forward", 400, 300),
          _event("user_annotation", "transformer_forward", 1100, 300),
          _py("pipe.py(1): loop", 0, 2000, 1, 0), _py("pipe.py(10): f", 310, 80, 2, 1), _py("pipe.py(20): g", 320, 30, 3, 2),
          _py("pipe.py(30): h", 750, 300, 4, 1)]
    for i, (ts, dur) in enumerate([(0, 250), (420, 270), (1120, 270)]):
        ev.append(_event("cuda_runtime", "cudaLaunchKernel", ts, 1, correlation=i + 1))
        ev.append(_event("kernel", f"k{i}", ts, dur, tid=7, correlation=i + 1, stream=7))
    path = tmp_path / "gaps.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return load(path)


def test_known_gaps_and_their_functions(synthetic):
    g = attribute(synthetic)
    kinds = {(k["source"], k["kind"]): k for k in g["kinds"]}
    assert set(kinds) == {("cpu gap", "within a step"), ("cpu gap", "between steps"), ("gpu idle", "in a step"),
                          ("gpu idle", "between steps")}
    within = kinds[("cpu gap", "within a step")]
    assert (within["gaps"], within["total_us"]) == (1, 100.0)
    fns = {f["function"]: f for f in within["functions"]}
    assert fns["pipe.py:10 f"] == {"function": "pipe.py:10 f", "inclusive_us": 80.0, "self_us": 50.0}
    assert fns["pipe.py:20 g"] == {"function": "pipe.py:20 g", "inclusive_us": 30.0, "self_us": 30.0}
    assert within["hottest_chain"] == {"chain": "pipe.py:1 loop;pipe.py:10 f", "self_us": 50.0}
    assert [c["function"] for c in within["callers"]] == ["pipe.py:10 f", "pipe.py:20 g"]  # the loop spans it: left out
    between = kinds[("cpu gap", "between steps")]
    assert between["total_us"] == 400.0 and between["functions"][0] == {"function": "pipe.py:30 h", "inclusive_us": 300.0,
                                                                        "self_us": 300.0}
    assert kinds[("gpu idle", "in a step")]["total_us"] == 170.0
    assert kinds[("gpu idle", "between steps")]["total_us"] == 430.0
    # folded stacks, largest first: h's 300 µs under the loop, then the loop's own 100 µs
    assert folded_text(between).splitlines() == ["pipe.py:1 loop;pipe.py:30 h 300", "pipe.py:1 loop 100"]


def test_what_cannot_be_attributed_is_said(tmp_path):
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"traceEvents": [_event("kernel", "k", 0, 10, correlation=1, stream=7),
                                                _event("kernel", "k", 500, 10, correlation=2, stream=7)]}))
    g = attribute(load(path))
    assert g["kinds"][0]["kind"] == "in the call" and g["kinds"][0]["functions"] == []
    assert any("no `transformer_forward` spans" in n for n in g["notes"])
    assert any("no Python function events" in n for n in g["notes"])


def test_the_real_trace_gaps_are_the_hook_walk(real_trace):
    r = analyze(load(real_trace))
    kind = r["gaps"]["kinds"][0]
    assert (kind["source"], kind["kind"], kind["gaps"]) == ("gpu idle", "in the call", r["gpu"]["gaps_over_us"]["100"])
    assert kind["total_us"] == pytest.approx(sum(gap["length_us"] for gap in r["gpu"]["gaps"]))
    callers = {c["function"]: c["inclusive_us"] for c in kind["callers"]}
    # the hook registry's walk over every submodule, at each cache_context, is most of what the host did
    assert callers["diffusers/hooks/hooks.py:268 _set_context"] > 0.6 * kind["total_us"]
    assert kind["functions"][0]["function"].startswith("torch/nn/modules/module.py:") and "named_modules" in kind["functions"][0]["function"]


def test_a_fix_moves_its_function_out_of_the_gaps(synthetic, tmp_path):
    # the same trace without h: what a fix that removes h's work between steps looks like
    before = attribute(synthetic)
    raw = tmp_path / "after.json"
    events = json.loads((tmp_path / "gaps.json").read_text())["traceEvents"]
    raw.write_text(json.dumps({"traceEvents": [e for e in events if e["name"] != "pipe.py(30): h"]}))
    after = attribute(load(raw))
    rows = moved(before, after)
    assert {(r["source"], r["delta_us"]) for r in rows[:2] if r["function"] == "pipe.py:30 h"} == {
        ("cpu gap", -300.0), ("gpu idle", -300.0)}  # h ran in the CPU gap and the GPU idle gap between the steps
    assert all(r["function"] != "pipe.py:1 loop" for r in rows)  # it spans every gap: not a mover
    assert compare(synthetic, load(raw))["gap_functions"][0]["function"] == "pipe.py:30 h"


def test_chains_are_the_walk_from_each_event_also_past_200_frames():
    from lab.traces.gaps import PythonCalls

    calls = PythonCalls.__new__(PythonCalls)
    depth = 450  # one call chain deeper than the 200 frames a chain keeps
    calls.names = [f"f{k}" for k in range(depth)]
    calls._parents = [-1] + list(range(depth - 1))
    calls._chains = {}
    for i in (3, 150, 199, 200, 201, 320, 449, 10, 260):
        assert calls.chain(i) == calls._walk(i), i
    assert calls.chain(449).count(";") == 199 and calls.chain(5) == "f0;f1;f2;f3;f4;f5"


def test_parents_are_found_by_python_id_the_last_one_winning():
    import numpy as np

    from lab.traces.gaps import parent_index

    ids = np.array([5, 7, 5, -1, 9])
    parents = np.array([-1, 5, 7, 9, 4])
    # 7's parent id 5 is held by events 0 and 2 (the last wins, as a dict of ids would keep it); -1 and an id no
    # event has are roots
    assert parent_index(ids, parents).tolist() == [-1, 2, 1, 4, -1]
    assert parent_index(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


def test_the_functions_that_filled_the_gaps_most_over_every_gap_of_a_source(synthetic):
    """What a census page names as filling the CPU gaps: the most self time over both gaps (h's 300 µs, the loop's
    own 20 + 100 µs around f and h, then f's 50 µs; g's 30 µs is fourth), in milliseconds."""
    from lab.traces.gaps import top_functions

    assert top_functions(attribute(synthetic), "cpu gap") == [
        {"function": "pipe.py:30 h", "self_ms": 0.3}, {"function": "pipe.py:1 loop", "self_ms": 0.12},
        {"function": "pipe.py:10 f", "self_ms": 0.05}]
    assert [f["function"] for f in top_functions(attribute(synthetic), "cpu gap", top=4)][-1] == "pipe.py:20 g"
    # the census attributes the CPU gaps alone (a trace in an offload setting has thousands of GPU idle gaps)
    alone = attribute(synthetic, sources=("cpu gap",))
    assert {k["source"] for k in alone["kinds"]} == {"cpu gap"}
    assert top_functions(alone, "cpu gap") == top_functions(attribute(synthetic), "cpu gap")
    assert top_functions({"totals": {}}, "cpu gap") == []  # a trace without transformer spans has none


def test_the_callers_that_filled_the_gpu_idle_most(real_trace):
    """What a settings map's host trace names as keeping the device idle: on the real trace, the cache context and the
    hook registry's `_set_context` under it (its walk over every submodule) by inclusive time, the frames that span
    every gap whole left out."""
    from lab.traces.gaps import top_callers

    found = attribute(load(real_trace))
    callers = top_callers(found, "gpu idle")
    assert {c["function"] for c in callers[:2]} == {"diffusers/models/cache_utils.py:144 cache_context",
                                                    "diffusers/hooks/hooks.py:268 _set_context"}, callers
    whole = found["totals"]["gpu idle"]["gap_us"] / 1000
    assert all(0 < c["inclusive_ms"] < 0.95 * whole for c in callers)
    assert [c["inclusive_ms"] for c in callers] == sorted((c["inclusive_ms"] for c in callers), reverse=True)
    assert top_callers({"totals": {}}, "gpu idle") == []

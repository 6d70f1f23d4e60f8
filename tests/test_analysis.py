"""The trace analysis agrees exactly with independent computations on the real shared H200 trace."""

import gzip
import json
from collections import Counter

import pytest

from lab.traces.analysis import SYNC_CALLS, analyze, compare, headline, normalize_name, union_length
from lab.traces.trace import load
from tests.conftest import lab_here


@pytest.fixture(scope="module")
def raw(real_trace):
    with gzip.open(real_trace) as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(scope="module")
def result(real_trace):
    return analyze(load(real_trace), functions=("hooks.py:_set_context",))


def independent_gpu_idle_ns(events) -> tuple[int, list[int]]:
    """Plain-Python union of GPU intervals (µs floats -> integer ns), written separately from lab.traces.analysis."""
    intervals = sorted(
        (round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    busy, gaps = 0, []
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e in intervals) - intervals[0][0]
    return span - busy, gaps


@pytest.mark.slow
def test_sync_counts_by_name_match(raw, result):
    expected = Counter(e["name"] for e in raw if e.get("cat") == "cuda_runtime" and e["name"] in SYNC_CALLS)
    assert {k: v["count"] for k, v in result["syncs"]["by_call"].items()} == dict(expected)
    assert result["syncs"]["count"] == 24  # 22 cudaStreamSynchronize + 2 cudaDeviceSynchronize


def test_gpu_idle_matches_to_the_microsecond(raw, result):
    idle_ns, gaps = independent_gpu_idle_ns(raw)
    assert abs(result["gpu"]["whole"]["idle_us"] - idle_ns / 1000) < 1.0
    assert abs(result["gpu"]["whole"]["idle_us"] - 58446.4) < 1.0  # HTA with ns rounding disabled: 58,446 µs
    assert result["gpu"]["gaps_over_us"]["100"] == sum(g > 100_000 for g in gaps) == 41
    assert result["gpu"]["gaps_over_us"]["10"] == sum(g > 10_000 for g in gaps) == 213


def test_host_reads_and_memcpy_directions(raw, result):
    reads = sum(1 for e in raw if e.get("cat") == "cpu_op" and e["name"] == "aten::_local_scalar_dense")
    assert result["host_reads"]["scalar_reads"] == reads
    assert result["host_reads"]["memcpy"]["HtoD"]["count"] == sum(
        1 for e in raw if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]
    )


def test_driver_api_launches_are_counted(raw, result):
    driver = sum(1 for e in raw if e.get("cat") == "cuda_driver" and e["name"] in ("cuLaunchKernel", "cuLaunchKernelEx"))
    assert driver == 4848
    assert result["launches"]["driver"] == {"cuLaunchKernelEx": 2928, "cuLaunchKernel": 1920}
    assert result["launches"]["cpu_runs_ahead"]


def test_sync_sites_are_attributed_to_diffusers_lines(result):
    sites = result["syncs"]["sites"]
    assert sites["diffusers/schedulers/scheduling_unipc_multistep.py:962 multistep_uni_c_bh_update"]["count"] == 9
    assert sites["diffusers/schedulers/scheduling_unipc_multistep.py:1100 index_for_timestep"]["count"] == 2


def test_named_function_totals(result):
    assert result["regions"]["functions"]["hooks.py:_set_context"]["count"] == 16


def test_union_length_handles_nesting_and_touching():
    import numpy as np

    total, s, e = union_length(np.array([0, 5, 2, 20, 30]), np.array([10, 8, 3, 30, 31]))
    assert total == 21 and list(s) == [0, 20] and list(e) == [10, 31]


def test_addresses_are_normalised():
    assert normalize_name("<built-in method add of set object at 0x7f7660cb3300>") == normalize_name(
        "<built-in method add of set object at 0x7f0000000001>"
    )


def test_compare_a_trace_with_itself_has_no_deltas(real_trace):
    trace = load(real_trace)
    c = compare(trace, trace)
    assert all(v["delta"] in (0, 0.0, None) for v in c["metrics"].values())
    assert c["name_counts"] == {}


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "the file is empty"),
        (b"not json at all", "not valid JSON"),
        (b'{"foo": 1}', "without `traceEvents`"),
        (b'{"traceEvents": []}', "the trace has no events"),
        (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "not a torch.profiler trace"),
    ],
)
def test_bad_input_is_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    out = lab_here("analyze", str(path))
    assert out.returncode == 2  # the trace is the user's input: bad input, as a bad option is
    assert message in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_truncated_gzip(tmp_path, real_trace):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(real_trace.read_bytes()[:100_000])
    out = lab_here("analyze", str(path))
    assert out.returncode == 2 and "truncated or damaged" in out.stderr and "Traceback" not in out.stderr


def test_headline_of_a_trace_without_gpu_or_steps(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 4.0, "dur": 2.0},
    ]}))
    r = analyze(load(path))
    h = headline(r)
    assert h["host_scalar_reads"] == 1 and h["gpu_idle_us"] is None and h["syncs_per_step"] is None
    assert "missing" in r["gpu"] and "CPU-only" in r["gpu"]["missing"]


def test_the_python_stack_at_a_time_is_the_frames_open_then(real_trace):
    """Frames.stack_at (reading only the blocks of frames still open) against a scan of every frame."""
    import numpy as np

    from lab.traces.timeline import Frames

    frames = Frames(load(real_trace))
    assert len(frames.ts) > 100_000  # hundreds of blocks

    def scan(t):
        hits = np.flatnonzero((frames.ts <= t) & (frames.end > t)).tolist()
        return [frames.names[i] for i in sorted(hits, key=lambda i: -frames.ts[i])]  # sorted() is stable

    rng = np.random.default_rng(0)
    k = rng.integers(0, len(frames.ts), 8)
    times = [int(frames.ts.min()) - 1, int(frames.end.max()), *frames.ts[k].tolist(), *(frames.end[k] - 1).tolist(),
             *rng.integers(frames.ts.min(), frames.end.max(), 8).tolist()]
    stacks = [frames.stack_at(t) for t in times]
    assert stacks[0] == [] and stacks[1] == [] and max(map(len, stacks)) > 10
    for t, stack in zip(times, stacks):
        assert stack == scan(t), t


def test_an_integer_column_counts_odd_values_as_missing():
    from lab.traces.trace import _ints

    assert _ints([3, None, "PyTorch Profiler", 7], -1).tolist() == [3, -1, -1, 7]
    assert _ints([1, 2], 0).tolist() == [1, 2] and _ints([], 0).tolist() == []

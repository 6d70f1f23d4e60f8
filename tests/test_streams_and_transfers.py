"""The device's work by stream and the host-device copies, on real GPU traces kept in the repository, each held against
a count made independently from the trace's raw JSON."""

import gzip
import json
from collections import defaultdict
from decimal import Decimal

import pytest

from lab.traces.streams import stream_analysis
from lab.traces.trace import load
from lab.traces.transfers import device_split, transfer_analysis
from tests.conftest import ROOT

TRACES = ROOT / "tests" / "data" / "traces"
#: offloaded calls (settings map points): group offloading without a stream, and at leaf level with one
OFFLOADED = ["flux2_group_offload_h200.json.gz", "flux2_leaf_stream_offload_h200.json.gz"]


def raw(path):
    """The trace's events, with every time as exact integer nanoseconds (the file holds µs with three decimals)."""
    with gzip.open(path) as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    for e in events:
        for key in ("ts", "dur"):
            if key in e:
                e[key] = int(Decimal(e[key]) * 1000)
    return events


def union_us(intervals):
    """The length of the union of [start, end) intervals in ns, as µs."""
    total, end = 0, -(2**63)
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1000


@pytest.mark.parametrize("name", ["sd35_h200_shapes.json.gz", "wan_base_compile.json.gz"])
def test_each_streams_busy_time_is_the_union_of_its_work(name):
    path = TRACES / name
    events = [e for e in raw(path) if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_stream = defaultdict(list)
    for e in events:
        by_stream[str(e["args"]["stream"])].append((e["ts"], e["ts"] + e["dur"]))
    found = stream_analysis(load(path))
    assert set(found["streams"]) == set(by_stream)
    for stream, intervals in by_stream.items():
        assert found["streams"][stream]["items"] == len(intervals)
        assert found["streams"][stream]["busy_us"] == pytest.approx(union_us(intervals), abs=0.01)
    everything = [i for v in by_stream.values() for i in v]
    assert found["union_us"] == pytest.approx(union_us(everything), abs=0.01)
    assert found["busiest_us"] == max(v["busy_us"] for v in found["streams"].values())
    assert found["busiest_us"] <= found["union_us"] + 1e-6


def test_a_cpu_trace_has_no_streams():
    assert "missing" in stream_analysis(load(TRACES / "sd35_tiny_cpu.json.gz"))


@pytest.mark.parametrize("name", ["sd35_h200_shapes.json.gz", "wan_base_compile.json.gz", *OFFLOADED])
def test_copies_by_direction_and_host_memory(name):
    path = TRACES / name
    expected = {d: defaultdict(lambda: [0, 0, 0.0]) for d in ("HtoD", "DtoH")}
    for e in raw(path):
        if e.get("ph") != "X" or e.get("cat") != "gpu_memcpy":
            continue
        head, _, sides = e["name"].partition(" (")
        direction = head.split()[1]
        if direction not in expected:
            continue
        src, dst = sides.rstrip(")").split(" -> ")
        row = expected[direction][(src if direction == "HtoD" else dst).lower()]
        row[0] += e["args"]["bytes"]
        row[1] += 1
        row[2] += e["dur"] / 1000
    found = transfer_analysis(load(path))
    assert any(expected[d] for d in expected), "the trace holds copies to check"
    for direction, memories in expected.items():
        assert set(found[direction]["by_memory"]) == set(memories)
        for memory, (nbytes, count, dur) in memories.items():
            got = found[direction]["by_memory"][memory]
            assert (got["bytes"], got["count"]) == (nbytes, count)
            assert got["us"] == pytest.approx(dur, abs=0.01)
        assert found[direction]["bytes"] == sum(v[0] for v in memories.values())
        assert found[direction]["count"] == sum(v[1] for v in memories.values())


def intersection_us(a, b):
    """The length of the intersection of two unions of [start, end) intervals in ns, as µs: |A| + |B| - |A u B|."""
    return union_us(a) + union_us(b) - union_us(a + b)


@pytest.mark.parametrize("name", ["sd35_h200_shapes.json.gz", "wan_base_compile.json.gz", *OFFLOADED])
def test_where_the_device_time_goes(name):
    path = TRACES / name
    events = [e for e in raw(path) if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def moved(e, direction=("HtoD", "DtoH")):
        return e["cat"] == "gpu_memcpy" and e["name"].split()[1] in direction

    copies = [(e["ts"], e["ts"] + e["dur"]) for e in events if moved(e)]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in events if not moved(e)]
    found = device_split(load(path))
    assert copies, "the trace holds copies to check"
    assert found["kernels_us"] == pytest.approx(union_us(compute), abs=0.01)
    assert found["device_us"] == pytest.approx(union_us(compute + copies), abs=0.01)
    assert found["copies_us"] == pytest.approx(union_us(copies), abs=0.01)
    # the copies' time beside no kernel: their union less the part of it some kernel ran beside
    assert found["exposed_us"] == pytest.approx(union_us(copies) - intersection_us(copies, compute), abs=0.01)
    for direction in ("HtoD", "DtoH"):
        busy = [(e["ts"], e["ts"] + e["dur"]) for e in events if moved(e, (direction,))]
        assert found[f"{direction}_us"] == pytest.approx(union_us(busy), abs=0.01)
    assert found["span_us"] == pytest.approx((max(e for _, e in compute + copies) - min(s for s, _ in compute + copies))
                                             / 1000, abs=0.01)


def test_copies_on_the_compute_stream_never_overlap_its_kernels_and_a_side_stream_does():
    """Group offloading without a stream copies each block on the compute stream, so every copy runs beside no kernel;
    with `use_stream=True` the copies run on a side stream, beside most of the kernels' time (the copies take twice
    the kernels' time here: the rest of them runs alone either way)."""
    one = device_split(load(TRACES / OFFLOADED[0]))
    side = device_split(load(TRACES / OFFLOADED[1]))
    assert one["copies_us"] > 0 and one["exposed_us"] == pytest.approx(one["copies_us"], rel=1e-3)
    assert side["copies_us"] - side["exposed_us"] > 0.5 * side["kernels_us"]
    # the same weights move either way: 2 steps of Flux2 Klein's transformer
    assert transfer_analysis(load(TRACES / OFFLOADED[0]))["HtoD"]["bytes"] == pytest.approx(
        transfer_analysis(load(TRACES / OFFLOADED[1]))["HtoD"]["bytes"], rel=0.01)

"""An offloaded call against the limits its copies and compute allow (`lab.verdicts.offload_limit`), on literal
numbers."""

import pytest

from lab.verdicts.offload_limit import obstacle, offload_limit

RATES = {"h2d_pageable": 8.0, "h2d_pinned": 50.0, "d2h_new_pageable": 1.5, "d2h_kept_pageable": 15.0,
         "d2h_pinned": 40.0}


def test_copies_longer_than_the_compute_set_the_overlap_limit():
    limit = offload_limit(call_ms=500.0, compute_ms=60.0, h2d_bytes=4_000_000_000, d2h_bytes=2_000_000_000,
                          rates=RATES)
    assert limit.h2d_ms == pytest.approx(80.0) and limit.d2h_ms == pytest.approx(50.0)
    assert limit.overlap_ms == pytest.approx(80.0)  # the longest of compute, HtoD and DtoH
    assert limit.serial_ms == pytest.approx(190.0)
    assert limit.multiple == pytest.approx(6.25) and limit.multiple_serial == pytest.approx(500 / 190)
    assert "6.25x the overlap limit" in limit.summary()


def test_compute_longer_than_the_copies_sets_the_overlap_limit():
    limit = offload_limit(call_ms=110.0, compute_ms=100.0, h2d_bytes=1_000_000_000, d2h_bytes=0, rates=RATES)
    assert limit.overlap_ms == 100.0 and limit.serial_ms == pytest.approx(120.0)
    assert limit.multiple == pytest.approx(1.1) and limit.multiple_serial < 1  # some copies already overlap


def test_a_fix_that_copies_less_lowers_its_own_limit():
    before = offload_limit(call_ms=500.0, compute_ms=60.0, h2d_bytes=4_000_000_000, d2h_bytes=4_000_000_000,
                           rates=RATES)
    after = offload_limit(call_ms=200.0, compute_ms=60.0, h2d_bytes=4_000_000_000, d2h_bytes=0, rates=RATES)
    assert after.serial_ms < before.serial_ms
    assert after.overlap_ms == pytest.approx(80.0) and before.overlap_ms == pytest.approx(100.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"call_ms": 0.0}, "positive"), ({"compute_ms": -1.0}, "positive"), ({"h2d_bytes": -1}, "negative"),
    ({"rates": {"h2d_pinned": 50.0}}, "d2h_pinned"),
])
def test_bad_inputs_are_refused(kwargs, message):
    args = {"call_ms": 100.0, "compute_ms": 50.0, "h2d_bytes": 10, "d2h_bytes": 10, "rates": RATES, **kwargs}
    with pytest.raises(ValueError, match=message):
        offload_limit(**args)


def split(kernels_ms, device_ms, h2d_busy_ms=0.0, d2h_busy_ms=0.0):
    """A device split (`lab.traces.transfers.device_split`, µs) whose copies beside no kernel take device - kernels."""
    return {"kernels_us": kernels_ms * 1e3, "exposed_us": (device_ms - kernels_ms) * 1e3, "device_us": device_ms * 1e3,
            "span_us": device_ms * 1e3, "HtoD_us": h2d_busy_ms * 1e3, "DtoH_us": d2h_busy_ms * 1e3}


def test_copies_beside_no_kernel_are_named_where_they_take_most():
    # 4 GB to the device beside 600 ms of compute: the copies ran 400 ms, 300 of them with no kernel beside
    limit = offload_limit(call_ms=1000.0, compute_ms=600.0, h2d_bytes=4_000_000_000, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=610.0, device_ms=910.0, h2d_busy_ms=400.0), profiled_ms=1000.0)
    assert found["largest"] == "exposed" and found["parts_ms"] == pytest.approx(
        {"kernels": 10.0, "exposed": 300.0, "idle": 90.0})
    assert found["reached_gbs"] == {"HtoD": pytest.approx(10.0), "DtoH": None}  # 4 GB in 400 ms
    assert found["text"].startswith("copies the compute does not hide: of a profiled call of 1,000 ms")
    assert "to the device at 10.0 GB/s while copying (pinned: 50)" in found["text"]


def test_a_device_with_nothing_to_do_names_the_host():
    limit = offload_limit(call_ms=2000.0, compute_ms=600.0, h2d_bytes=1_000_000_000, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=620.0, device_ms=700.0, h2d_busy_ms=25.0), profiled_ms=2050.0)
    assert found["largest"] == "idle" and found["parts_ms"]["idle"] == pytest.approx(1350.0)
    assert found["text"].startswith("the device waiting on the host")


def test_kernels_slower_than_without_offloading_are_named():
    limit = offload_limit(call_ms=1500.0, compute_ms=600.0, h2d_bytes=0, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=1400.0, device_ms=1400.0), profiled_ms=1450.0)
    assert found["largest"] == "kernels" and found["parts_ms"] == pytest.approx(
        {"kernels": 800.0, "exposed": 0.0, "idle": 50.0})
    assert found["reached_gbs"] == {"HtoD": None, "DtoH": None}

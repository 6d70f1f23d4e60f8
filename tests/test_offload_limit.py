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


def split(kernels_ms, copies_ms, device_ms, h2d_busy_ms=None, d2h_busy_ms=0.0):
    """A device split (`lab.traces.transfers.device_split`, µs): the copies beside no kernel take device - kernels."""
    return {"kernels_us": kernels_ms * 1e3, "copies_us": copies_ms * 1e3, "exposed_us": (device_ms - kernels_ms) * 1e3,
            "device_us": device_ms * 1e3, "span_us": device_ms * 1e3,
            "HtoD_us": (copies_ms if h2d_busy_ms is None else h2d_busy_ms) * 1e3, "DtoH_us": d2h_busy_ms * 1e3}


# 47.6 GB to the device at 55 GB/s (866 ms) beside 330 ms of compute: the copies bound the limit
COPY_BOUND = offload_limit(call_ms=1240.0, compute_ms=330.0, h2d_bytes=47_630_000_000, d2h_bytes=0,
                           rates={**RATES, "h2d_pinned": 55.0})


def test_copies_and_compute_in_turn_are_named_where_the_copies_bound_the_limit():
    # one stream: the copies (888 ms) and the kernels (326 ms) never overlap
    found = obstacle(COPY_BOUND, split(kernels_ms=326.0, copies_ms=888.0, device_ms=1214.0), profiled_ms=1240.0)
    assert found["copy_bound"] and found["largest"] == "compute_alone"
    assert found["parts_ms"] == pytest.approx({"slow_copies": 888.0 - 866.0, "compute_alone": 326.0, "idle": 26.0})
    assert found["text"].startswith("compute beside no copy (copies and compute in turn): its copies bound its limit "
                                    "(866 ms at the pinned rates, beside 330 ms of compute)")
    assert "to the device at 53.6 GB/s while copying (pinned: 55)" in found["text"]


def test_a_device_with_nothing_to_do_names_the_host():
    # a side stream hides most of the compute, but the device has nothing to do for 302 ms of the call
    found = obstacle(COPY_BOUND, split(kernels_ms=331.0, copies_ms=866.5, device_ms=948.4), profiled_ms=1250.0)
    assert found["largest"] == "idle" and found["parts_ms"]["idle"] == pytest.approx(301.6)
    assert found["parts_ms"]["compute_alone"] == pytest.approx(81.9)
    assert found["text"].startswith("the device waiting on the host")


def test_copies_slower_than_the_host_rate_are_named():
    limit = offload_limit(call_ms=430.0, compute_ms=60.0, h2d_bytes=4_000_000_000, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=60.0, copies_ms=400.0, device_ms=420.0), profiled_ms=430.0)
    assert found["largest"] == "slow_copies" and found["parts_ms"] == pytest.approx(
        {"slow_copies": 320.0, "compute_alone": 20.0, "idle": 10.0})
    assert found["reached_gbs"] == {"HtoD": pytest.approx(10.0), "DtoH": None}  # 4 GB in 400 ms


def test_copies_beside_no_kernel_are_named_where_the_compute_bounds_the_limit():
    limit = offload_limit(call_ms=950.0, compute_ms=600.0, h2d_bytes=1_000_000_000, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=610.0, copies_ms=300.0, device_ms=900.0), profiled_ms=950.0)
    assert not found["copy_bound"] and found["largest"] == "exposed"
    assert found["parts_ms"] == pytest.approx({"kernels": 10.0, "exposed": 290.0, "idle": 50.0})
    assert found["text"].startswith("copies the compute does not hide: its compute bounds its limit (600 ms")


def test_kernels_slower_than_without_offloading_are_named():
    limit = offload_limit(call_ms=1500.0, compute_ms=600.0, h2d_bytes=0, d2h_bytes=0, rates=RATES)
    found = obstacle(limit, split(kernels_ms=1400.0, copies_ms=0.0, device_ms=1400.0), profiled_ms=1450.0)
    assert found["largest"] == "kernels" and found["parts_ms"] == pytest.approx(
        {"kernels": 800.0, "exposed": 0.0, "idle": 50.0})
    assert found["reached_gbs"] == {"HtoD": None, "DtoH": None}

"""An offloaded call against the limits its copies and compute allow (`lab.verdicts.offload_limit`), on literal
numbers."""

import pytest

from lab.verdicts.offload_limit import offload_limit

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

"""Statistics on literal samples, with known values."""

import math

import pytest

from lab import stats

CONTROL = [100.0, 101.0, 99.5, 100.4, 100.9, 99.8, 100.2, 100.6, 99.9, 100.3]
FASTER = [95.1, 95.9, 94.6, 95.4, 96.0, 94.9, 95.2, 95.7, 95.0, 95.3]


def test_paired_ratios_and_errors():
    assert stats.paired_ratios([2.0, 4.0], [1.0, 4.0]) == [0.5, 1.0]
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        stats.paired_ratios([0.0], [1.0])


def test_min_p_and_blocks_needed():
    assert stats.min_p_signed_rank(5) == pytest.approx(0.0625)
    assert stats.min_p_signed_rank(6) == pytest.approx(0.03125)
    assert stats.blocks_needed(0.05) == 6
    assert stats.blocks_needed(0.01) == 8
    # asv's point: 3 vs 3 runs can never be significant with a rank test
    assert stats.min_p_mann_whitney(3, 3) == pytest.approx(0.1)
    assert stats.min_p_mann_whitney(5, 5) == pytest.approx(2 / 252)


def test_wilcoxon_exact_value_and_symmetry():
    # every difference negative, n=10: exact two-sided p = 2/2**10
    assert stats.wilcoxon_p(CONTROL, FASTER) == pytest.approx(2 / 1024)
    assert stats.wilcoxon_p(FASTER, CONTROL) == pytest.approx(stats.wilcoxon_p(CONTROL, FASTER))
    assert stats.wilcoxon_p(CONTROL, CONTROL) == 1.0


def test_mann_whitney_fully_separated():
    assert stats.mann_whitney_p(CONTROL, FASTER) == pytest.approx(2 / math.comb(20, 10))


def test_bootstrap_ci_is_seeded_and_brackets_the_median():
    ratios = stats.paired_ratios(CONTROL, FASTER)
    lo, hi = stats.bootstrap_ci(ratios)
    assert (lo, hi) == stats.bootstrap_ci(ratios)
    assert lo <= stats.median(ratios) <= hi
    assert 0.94 < lo < hi < 0.96


def test_verdict_faster_and_slower():
    c = stats.compare(CONTROL, FASTER)
    assert c.verdict == "faster" and "x faster" in c.summary and c.ratio_ci[1] < 1
    s = stats.compare(FASTER, CONTROL)
    assert s.verdict == "slower"


def test_verdict_insufficient_samples():
    c = stats.compare(CONTROL[:5], FASTER[:5])
    assert c.verdict == "insufficient samples" and "at least 6 blocks" in c.summary


def test_equivalence_and_no_change():
    # tiny symmetric noise around a ratio of 1: equivalent within ±1%
    control = [100.0 + 0.1 * i for i in range(12)]
    test = [x * (1 + (0.001 if i % 2 else -0.001)) for i, x in enumerate(control)]
    assert stats.compare(control, test, margin=0.01).verdict == "equivalent within ±1%"
    # large symmetric noise: neither different nor shown equivalent
    noisy = [x * (1 + (0.05 if i % 2 else -0.05)) for i, x in enumerate(control)]
    assert stats.compare(control, noisy, margin=0.01).verdict == "no significant change"


def test_tost_p_known_value():
    ratios = [1.0] * 8
    # log ratios sit 0.00995 above the lower bound and below the upper for every pair: exact one-sided p = 1/2**8
    assert stats.tost_p(ratios, 0.01) == pytest.approx(1 / 256)


def test_stability_warnings():
    assert stats.stability_warnings(CONTROL, FASTER) == []
    noisy = [100, 130, 80, 120, 90, 140, 70, 100, 110, 95]
    assert any("standard deviation" in w for w in stats.stability_warnings(noisy, noisy))
    spiky = CONTROL[:-1] + [300.0]
    assert any("outlier" in w for w in stats.stability_warnings(spiky, CONTROL))
    drifting = [100 + 2 * i for i in range(10)]
    assert any("drift" in w for w in stats.stability_warnings(drifting, CONTROL))


def test_order_effect_recovers_a_second_call_penalty():
    # true effect 1.0, the second call of each block 4% slower: ratios 1.04 (test second) and 1/1.04 (test first)
    control = [100.0, 104.0, 100.0, 104.0]
    test = [104.0, 100.0, 104.0, 100.0]
    assert stats.order_effect(control, test, [False, True, False, True]) == pytest.approx(0.04)
    assert stats.order_effect(control, test, [False] * 4) is None


def test_median_metrics_of_profiled_pairs():
    pairs = [{"syncs": {"control": 8, "test": 5, "delta": -3}, "gpu_idle_us": {"control": 20_800.0, "test": 12_400.0, "delta": 0},
              "launches_per_step": {"control": None, "test": None, "delta": None}},
             {"syncs": {"control": 8, "test": 5, "delta": -3}, "gpu_idle_us": {"control": 102_800.0, "test": 12_400.0, "delta": 0},
              "launches_per_step": {"control": None, "test": None, "delta": None}},
             {"syncs": {"control": 8, "test": 5, "delta": -3}, "gpu_idle_us": {"control": 259_700.0, "test": 11_900.0, "delta": 0},
              "launches_per_step": {"control": None, "test": None, "delta": None}}]
    m = stats.median_metrics(pairs)
    assert m["syncs"] == {"control": 8, "test": 5, "delta": -3}  # equal in every pair: no range
    assert m["gpu_idle_us"]["control"] == 102_800.0 and m["gpu_idle_us"]["control_range"] == [20_800.0, 259_700.0]
    assert m["gpu_idle_us"]["test"] == 12_400.0 and m["gpu_idle_us"]["delta"] == 12_400.0 - 102_800.0
    assert m["launches_per_step"] == {"control": None, "test": None, "delta": None}
    assert stats.median_metrics(pairs[:1])["gpu_idle_us"] == {"control": 20_800.0, "test": 12_400.0, "delta": -8_400.0}

"""Statistics on literal samples, with known values, and the decision rule's error rates by simulation."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from lab.verdicts import stats

CONTROL = [100.0, 101.0, 99.5, 100.4, 100.9, 99.8, 100.2, 100.6, 99.9, 100.3]
FASTER = [95.1, 95.9, 94.6, 95.4, 96.0, 94.9, 95.2, 95.7, 95.0, 95.3]


def test_paired_ratios_and_errors():
    assert stats.paired_ratios([2.0, 4.0], [1.0, 4.0]) == [0.5, 1.0]
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        stats.paired_ratios([0.0], [1.0])


def test_critical_ranks_match_the_published_signed_rank_table():
    # two-sided alpha 0.05: reject when T <= 0, 2, 3, 5, 8, 10, 13 for n = 6..12 (so the interval's rank is one more)
    assert [stats.critical_rank(n, 0.05) for n in range(6, 13)] == [1, 3, 4, 6, 9, 11, 14]
    assert [stats.critical_rank(n, 0.05) for n in range(1, 6)] == [0] * 5
    assert stats.first_decidable(0.05) == 6 and stats.first_decidable(0.10) == 5 and stats.first_decidable(0.01) == 8
    assert stats.signed_rank_cdf(3).tolist() == pytest.approx([1 / 8, 2 / 8, 3 / 8, 5 / 8, 6 / 8, 7 / 8, 1.0])


def test_a_budget_too_short_for_the_first_decision_is_named():
    design = stats.sequential_design(6, 40, 0.05)
    # 2 / 2**7 is the first two-sided tail under the equivalence look's level, 2 / 2**8 under the faster/slower one's
    assert stats.first_decidable(design.alpha_look_eq) == 7 and stats.first_decidable(design.alpha_look) == 8
    # 45 s blocks: 2 min buys 2 blocks, 5 min 15 s buys 7, 6 min buys 8; after 6 blocks of an earlier run, 90 s more
    # buys 8
    short = stats.budget_too_short(120, 45, design)
    assert "about 2 block(s), fewer than the 7 the rule needs to decide anything" in short
    assert "the 8 it needs to call a change" in short and "at least 6 min reaches 8" in short
    equivalence_only = stats.budget_too_short(315, 45, design)
    assert "about 7 block(s): enough to find the arms within the margin" in equivalence_only
    assert "fewer than the 8 the rule needs to call a change faster or slower" in equivalence_only
    assert stats.budget_too_short(360, 45, design) is None
    assert stats.budget_too_short(90, 45, design, done=6) is None
    assert stats.budget_too_short(60, 45, design, done=6) is not None  # 7 blocks
    assert stats.budget_too_short(10, 45, design, done=0) is not None  # the first block always runs: 1 block


def test_a_large_change_one_block_short_of_its_first_finite_interval_says_how_many_it_needs():
    # Wan in group offloading, group_offload_keep_host on two H200s: 7 blocks at about a quarter of the control's time
    # left the faster/slower interval unbounded at its 99.07 % per look, with the equivalence one already finite
    design = stats.sequential_design(6, 40, 0.05)
    ratios = [0.2474, 0.2377, 0.2649, 0.2459, 0.2512, 0.2401, 0.2448]
    d = [math.log(r) for r in ratios]
    seven = stats.decide(d, design, 0.01)
    assert seven.outcome is stats.Verdict.UNDECIDED and not seven.interval.finite and seven.interval_eq.finite
    assert "7 blocks can give no finite 95% sequential" in seven.summary()
    assert "at least 8 are needed to call one faster or slower" in seven.summary()
    eight = stats.decide(d + [math.log(0.2460)], design, 0.01)
    assert eight.outcome is stats.Verdict.FASTER and "4." in eight.summary()


def test_hodges_lehmann_on_a_literal_sample():
    d = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    iv = stats.hodges_lehmann(d, 0.05)
    assert iv.estimate == 3.5 and (iv.lo, iv.hi) == (1.0, 6.0)  # rank 1 of 21 Walsh averages at n = 6
    assert stats.walsh_averages([1.0, 3.0]).tolist() == [1.0, 2.0, 3.0]
    wide = stats.hodges_lehmann(d[:5], 0.05)
    assert wide.estimate == 3.0 and not wide.finite


def test_interval_and_test_agree_on_every_sample():
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(6, 25))
        d = rng.normal(rng.normal(0, 0.6), 1, n)
        iv = stats.hodges_lehmann(d, 0.05)
        p = stats.signed_rank_p(d)
        assert (iv.lo > 0 or iv.hi < 0) == (p < 0.05)
        assert p == pytest.approx(sps.wilcoxon(d, method="exact").pvalue)


def test_mann_whitney_fully_separated():
    assert stats.mann_whitney_p(CONTROL, FASTER) == pytest.approx(2 / math.comb(20, 10))


def test_verdict_faster_and_slower():
    c = stats.compare(CONTROL, FASTER)
    assert c.verdict == "faster" and c.direction == "faster" and c.ci[1] < 1 and "x faster" in c.summary
    assert c.p_signed_rank == pytest.approx(2 / 1024)
    s = stats.compare(FASTER, CONTROL)
    assert s.verdict == "slower" and s.ci[0] > 1


def test_verdict_insufficient_samples():
    c = stats.compare(CONTROL[:4], FASTER[:4])
    assert c.verdict == "insufficient samples" and "at least 5 are needed to decide anything, 6 to call" in c.summary


def test_equivalent_both_and_undecided():
    control = [100.0 + 0.1 * i for i in range(12)]
    # tiny symmetric noise around a ratio of 1: equivalent within ±1%, and the 90% interval is what is shown
    test = [x * (1 + (0.001 if i % 2 else -0.001)) for i, x in enumerate(control)]
    c = stats.compare(control, test, margin=0.01)
    assert c.verdict == "equivalent within ±1%" and "90% CI" in c.summary
    assert 0.99 <= c.ci_equivalence[0] and c.ci_equivalence[1] <= 1.01
    # a small, consistent gain: faster and within ±1% at once
    small = [x * (0.996 + (0.0005 if i % 2 else -0.0005)) for i, x in enumerate(control)]
    both = stats.compare(control, small, margin=0.01)
    assert both.verdict == "faster, within ±1%" and both.direction == "faster" and both.equivalent
    assert both.summary.startswith("1.004x faster [")
    # large symmetric noise: neither different nor shown equivalent
    noisy = [x * (1 + (0.05 if i % 2 else -0.05)) for i, x in enumerate(control)]
    u = stats.compare(control, noisy, margin=0.01)
    assert u.verdict == "undecided" and u.ci[0] < 1 < u.ci[1] and u.blocks_to_decide > 12


def test_verdict_never_contradicts_its_intervals():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(4, 30))
        control = rng.uniform(90, 110, n)
        test = control * np.exp(rng.normal(rng.normal(0, 0.01), rng.uniform(0.001, 0.03), n))
        c = stats.compare(control.tolist(), test.tolist())
        lo, hi = c.ci
        elo, ehi = c.ci_equivalence
        assert c.verdict.startswith("faster") == (hi < 1)
        assert c.verdict.startswith("slower") == (lo > 1)
        assert ("within" in c.verdict) == (0.99 <= elo and ehi <= 1.01)


def test_sequential_design_levels():
    d = stats.sequential_design(6, 40)
    assert d.kind == "sequential" and 0.005 < d.alpha_look < 0.012 and 0.012 < d.alpha_look_eq < 0.025
    assert stats.sequential_design(6, 40) is d  # cached
    assert stats.sequential_design(6, 12).alpha_look > d.alpha_look  # fewer looks: less to pay per look
    # a fixed design is one look at alpha
    f = stats.fixed_design(8)
    assert (f.alpha_look, f.alpha_look_eq, f.level(), f.level(equivalence=True)) == (0.05, 0.10, "95%", "90%")
    assert d.level().startswith("95% sequential (")
    with pytest.raises(ValueError):
        stats.sequential_design(10, 6)


def _simulate(design, shift, draw, trials, seed, margin=0.01):
    rng = np.random.default_rng(seed)
    verdicts = []
    for _ in range(trials):
        d = draw(rng, design.max_blocks) + shift
        for n in range(design.min_blocks, design.max_blocks + 1):
            decision = stats.decide(d[:n], design, margin)
            if decision.decided:
                break
        verdicts.append(decision.verdict)
    return verdicts


@pytest.mark.parametrize("draw", [lambda r, n: r.normal(0, 0.01, n),
                                  lambda r, n: r.standard_t(2, n) * 0.01,  # heavy tails: a disturbed block now and then
                                  lambda r, n: np.where(r.random(n) < 0.8, r.normal(0, 0.004, n), r.normal(0, 0.04, n))],
                         ids=["normal", "t2", "mixture"])
def test_sequential_looks_keep_the_error_rates(draw):
    """Looking after every block from 6 to 30: no effect is called faster or slower at most alpha of the time, even
    with no margin to stop at (every look counts), and an effect just outside the margin is called equivalent at
    most alpha of the time (alpha + 2 standard errors)."""
    design = stats.sequential_design(6, 30)
    trials, bound = 600, 0.05 + 2 * math.sqrt(0.05 * 0.95 / 600)
    null = _simulate(design, 0.0, draw, trials, seed=1, margin=0.0)
    assert sum(v.startswith(("faster", "slower")) for v in null) / trials <= bound
    edge = _simulate(design, math.log(1.0101), draw, trials, seed=2)
    assert sum("within" in v for v in edge) / trials <= bound
    # and the same looks at the fixed level would not: that is what the stricter per-look level pays for
    naive = stats.Design("sequential", 6, 30, 0.05, 0.05, 0.10)
    wrong = _simulate(naive, 0.0, draw, trials, seed=1, margin=0.0)
    assert sum(v.startswith(("faster", "slower")) for v in wrong) / trials > 0.1


def test_blocks_to_decide():
    control = [100.0] * 8
    test = [100.0 * (0.995 + (0.02 if i % 2 else -0.02) + 0.001 * i) for i in range(8)]
    decision = stats.decide(stats.log_ratios(control, test), stats.fixed_design(8), 0.01)
    assert not decision.decided
    need = stats.blocks_to_decide(decision)
    assert need is not None and need > 8
    assert stats.blocks_to_decide(stats.decide(stats.log_ratios(CONTROL, FASTER), stats.fixed_design(10), 0.01)) == 10


def test_bimodal_arms_are_found():
    # the H100 Qwen-Image zero_cond control arm: calls near 225 ms and near 355 ms
    calls = [224.1, 226.3, 225.0, 352.9, 227.8, 359.6, 224.9, 355.2, 226.0, 360.1, 225.5, 351.7]
    modes = stats.bimodal(calls)
    assert modes is not None and (modes.n_low, modes.n_high) == (7, 5) and 0.55 < modes.jump < 0.6
    assert stats.bimodal(CONTROL) is None  # one cluster
    assert stats.bimodal([100.0, 100.1, 100.2, 130.0]) is None  # one outlier is not a mode
    warnings = stats.stability_warnings(CONTROL[:8], CONTROL[:8], raw={"control": calls, "test": CONTROL})
    assert any(w.startswith("control: the call times are bimodal: 7 calls near") for w in warnings)


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


def test_binomial_tail_on_literal_counts():
    # P(X >= k), X ~ Binomial(n, 0.05): by hand, 1 - 0.95^n - n 0.05 0.95^(n-1) for k = 2
    assert stats.binomial_tail(2, 18, 0.05) == pytest.approx(1 - 0.95 ** 18 - 18 * 0.05 * 0.95 ** 17)
    assert stats.binomial_tail(3, 20, 0.05) == pytest.approx(0.07548, abs=1e-5)
    assert stats.binomial_tail(0, 5, 0.05) == 1.0 and stats.binomial_tail(6, 5, 0.05) == 0.0


def test_null_checks_pass_balanced_blocks_and_name_each_broken_assumption():
    balanced = [[0.1, -0.1, 0.2, -0.2], [-0.15, 0.15, 0.05, -0.05], [0.12, -0.12, -0.02, 0.02]]
    checks = stats.null_checks(balanced)
    assert checks.blocks == 12 and checks.broken() == []
    # one arm favoured in every block
    biased = [[0.1, 0.2, 0.15, 0.12, 0.3, 0.05], [0.11, 0.22, 0.08, 0.17, 0.25, 0.09]]
    assert [b.split(" (")[0] for b in stats.null_checks(biased).broken()] == ["symmetry around 1"]
    # trials that each sit somewhere else, symmetric around 0 as a whole
    shifted = [[1.0 + x for x in (0.01, -0.01, 0.02, -0.02, 0.03, -0.03)],
               [-1.0 + x for x in (0.01, -0.01, 0.02, -0.02, 0.03, -0.03)],
               [2.0 + x for x in (0.01, -0.01, 0.02, -0.02, 0.03, -0.03)],
               [-2.0 + x for x in (0.01, -0.01, 0.02, -0.02, 0.03, -0.03)]]
    assert any(b.startswith("trials alike") for b in stats.null_checks(shifted).broken())
    # a drift within each trial
    drift = [[-0.5, -0.4, -0.3, -0.2, -0.1, 0.1, 0.2, 0.3, 0.4, 0.5]] * 3
    assert any(b.startswith("independent consecutive blocks") for b in stats.null_checks(drift).broken())
    assert stats.null_checks([[0.1, -0.1]]) is None  # too few blocks to say anything
    # blocks that flip from one to the next (an order effect under the counterbalanced order): anti-correlated,
    # which makes the rule conservative: said, and not counted as broken
    flipping = [[0.1, -0.12, 0.11, -0.09, 0.13, -0.1, 0.12, -0.11, 0.09, -0.13]] * 3
    checks = stats.null_checks(flipping)
    assert checks.serial_p < 0.01 and checks.serial_rho < 0 and checks.alternating() and checks.broken() == []
    assert not stats.null_checks(drift).alternating() and stats.null_checks(drift).serial_rho > 0


def test_process_spread_splits_a_block_s_spread_into_the_process_and_its_calls():
    # identical calls in each process: all of the spread is the processes' levels (logs 0, ln 2, ln 4: sd ln 2)
    only_processes = stats.process_spread([[10.0, 10.0], [20.0, 20.0], [40.0, 40.0]])
    assert only_processes.within_sd == 0 and only_processes.process_share == 1
    assert only_processes.between_sd == pytest.approx(math.log(2))
    # every process the same mix of calls: no process effect at all
    only_calls = stats.process_spread([[10.0, 12.0], [12.0, 10.0], [10.0, 12.0], [12.0, 10.0]])
    assert only_calls.between_sd == 0 and only_calls.process_share == 0
    assert only_calls.within_sd == pytest.approx(math.sqrt(2 * (math.log(1.2) / 2) ** 2))
    # a scale of the clock changes nothing; too few processes say nothing
    scaled = stats.process_spread([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    assert scaled.between_sd == pytest.approx(only_processes.between_sd)
    assert stats.process_spread([[10.0, 11.0], [12.0, 13.0], [14.0]]) is None


def test_a_block_s_spread_and_the_blocks_an_effect_needs():
    spread = stats.ProcessSpread(processes=10, calls_per_process=2, within_sd=0.1, between_sd=0.2)
    assert spread.block_sd() == pytest.approx(0.3)  # sqrt(2 * 0.2^2 + 2 * 0.1^2 / 2)
    assert spread.block_sd(100) == pytest.approx(math.sqrt(0.08 + 0.0002))
    assert spread.process_share == pytest.approx(0.08 / 0.09)
    # (1.95996 + 0.84162)^2 * 0.3^2 / ln(1.05)^2 = 296.7...
    assert spread.blocks_for(0.05) == 297


def test_call_spread_is_the_robust_sd_of_one_call_from_the_ratios_inside_blocks():
    # log(call / the block's first call): ln 1.1, ln 0.95, 0, ln 1.05, ln 0.95, ln 1.03; their MAD is 0.05004 (the
    # mean of the middle two deviations, 0.03401 and 0.06607), x 1.4826 / sqrt(2): a ratio holds two calls' noise
    blocks = [[100, 110], [200, 190], [50, 50], [80, 84], [120, 114], [300, 309]]
    spread, ratios = stats.call_spread(blocks)
    assert ratios == 6 and spread == pytest.approx(0.05004 * 1.4826 / math.sqrt(2), rel=1e-3)
    # three calls a block: two ratios each, all against the block's first call; the level between blocks cancels
    assert stats.call_spread([[100, 110, 95], [200, 190, 206], [50, 50, 51.5]])[1] == 6
    assert stats.call_spread([[100, 110, 95], [20_000, 22_000, 19_000], [50, 50, 51.5]])[0] == pytest.approx(
        stats.call_spread([[100, 110, 95], [200, 220, 190], [50, 50, 51.5]])[0])
    assert stats.call_spread([[100, 110], [200, 190]]) is None  # too few ratios to read a spread from
    assert stats.call_spread([[100], [200], [300], [400], [500], [600], [700]]) is None  # one call a block: none


def test_blocks_to_find_equivalent_grow_with_the_square_of_the_spread():
    fixed = stats.fixed_design(8)  # its equivalence interval at 90 %: z = 1.6449
    # (1.6449 * sqrt(pi / 3) * 0.05 / ln 1.01)^2 = (1.6449 * 1.02333 * 5.02494)^2 = 71.55 blocks
    assert stats.blocks_to_find_equivalent(0.05, 2, 0.01, fixed) == 72
    assert stats.blocks_to_find_equivalent(0.05, 1, 0.01, fixed) == 144  # one call per arm: twice the variance
    # a steady call: never fewer than the 5 blocks at which a 90 % signed-rank interval can be finite
    assert stats.blocks_to_find_equivalent(0.01, 2, 0.01, fixed) == 5
    assert stats.blocks_to_find_equivalent(0.05, 2, 0.0, fixed) is None  # no margin: no equivalence to find
    # the sequential design's equivalence looks at 98.05 %: z = 2.334, (2.334 * 1.02333 * 3.5174)^2 = 70.6 blocks
    # (a group-offload call spreading 3.5 %), past the design's 40; at 0.1 % its fewest, 7
    sequential = stats.sequential_design(6, 40)
    assert stats.blocks_to_find_equivalent(0.035, 2, 0.01, sequential) == 71
    assert stats.blocks_to_find_equivalent(0.001, 2, 0.01, sequential) == 7

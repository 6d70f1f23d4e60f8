"""The bound a trace puts on an A/B's effect (`lab.verdicts.bound`) and the decision that uses it, on literal
samples."""

import math

import pytest

from lab.verdicts.bound import BOUND_CALLS, PROFILED_ALLOWANCE, busy_floor, trace_bound
from lab.verdicts.decision import decide
from lab.verdicts.designs import sequential_design
from lab.verdicts.verdict import Verdict

CALLS = [1000.0, 1001.0, 999.5, 1000.4, 1000.9, 999.8, 1000.2, 1000.6]


def test_a_gpu_bound_call_is_bounded_inside_the_margin():
    b = trace_bound(CALLS, [w - 0.5 for w in CALLS], [999.0, 999.3, 998.9], [998.8, 999.1], margin=0.01)
    assert not b.reason and b.decided
    assert b.lo == pytest.approx(busy_floor([998.8, 999.1]) / max(CALLS))
    assert b.hi == pytest.approx((max(CALLS) - 0.5) / busy_floor([999.0, 999.3, 998.9]))
    assert b.lo < 1 < b.hi
    assert "bounded by the trace" in b.summary()


def test_an_idle_gpu_bounds_nothing_inside_the_margin():
    # the control's GPU is idle 5 % of its call (a host stall per step): the test arm may win up to that
    b = trace_bound(CALLS, [w * 0.95 for w in CALLS], [950.0, 950.5], [949.8, 950.2], margin=0.01)
    assert not b.reason and not b.decided
    assert b.gain == pytest.approx(1 - busy_floor([949.8, 950.2]) / max(CALLS))
    assert b.gain > 0.04
    assert "wider than ±1%" in b.summary()


def test_the_floor_takes_off_the_spread_and_at_least_the_profilers_allowance():
    assert busy_floor([990.0, 1000.0]) == 980.0  # the spread, where it is larger
    assert busy_floor([1000.0, 1000.0]) == pytest.approx(1000.0 * (1 - PROFILED_ALLOWANCE))  # else the allowance
    assert busy_floor([1000.0, 1001.0]) == pytest.approx(1000.0 * (1 - PROFILED_ALLOWANCE))


def test_the_spread_of_the_busy_time_widens_the_bound():
    steady = trace_bound(CALLS, CALLS, [998.0, 998.0], [998.0, 998.0], margin=0.01)
    moving = trace_bound(CALLS, CALLS, [990.0, 1000.0], [990.0, 1000.0], margin=0.01)
    assert steady.decided and not moving.decided
    assert moving.lo < steady.lo and moving.hi > steady.hi


def test_the_slowest_call_stands_for_the_arm():
    slow = CALLS[:-1] + [1050.0]  # one slow call widens its side only
    b = trace_bound(slow, CALLS, [995.0, 995.2], [995.0, 995.2], margin=0.01)
    assert b.control_wall_ms == 1050.0 and b.test_wall_ms == max(CALLS)
    assert b.lo == pytest.approx(busy_floor([995.0, 995.2]) / 1050.0)


@pytest.mark.parametrize("walls, busy, why", [
    (CALLS[:BOUND_CALLS - 1], [995.0, 995.1], "unprofiled call"),
    (CALLS, [995.0], "profiled call"),
])
def test_too_few_calls_give_no_bound(walls, busy, why):
    b = trace_bound(walls, walls, busy, busy, margin=0.01)
    assert why in b.reason and not b.decided
    assert b.lo == 0 and math.isinf(b.hi)


def test_no_gpu_work_gives_no_bound():
    assert trace_bound(CALLS, CALLS, [0.0, 0.0], [5.0, 5.0], margin=0.01).reason


# --- the decision with a bound ---------------------------------------------------------------------------------------

D = [0.012, -0.018, 0.031, -0.027, 0.006, -0.009, 0.024, -0.033, 0.003, 0.015]  # log ratios around 0, ±3 % each


def test_the_bound_cuts_the_equivalence_interval_and_only_that():
    design = sequential_design(6, 40, 0.05)
    alone = decide(D, design, 0.01)
    assert alone.outcome is Verdict.UNDECIDED  # ten blocks of ±3 % noise do not fit inside ±1 %
    cut = decide(D, design, 0.01, bound=(0.995, 1.004))
    assert cut.outcome is Verdict.BOUNDED and cut.bounded and cut.equivalent and not cut.equivalent_alone
    assert cut.ci_bounded == (max(alone.ci_eq[0], 0.995), min(alone.ci_eq[1], 1.004))
    assert cut.ci == alone.ci  # the faster/slower interval is never cut
    assert "bounded by the trace" in cut.summary() and "cut by the trace's bound" in cut.summary()


def test_a_wide_bound_changes_nothing():
    design = sequential_design(6, 40, 0.05)
    assert decide(D, design, 0.01, bound=(0.9, 1.1)).outcome is decide(D, design, 0.01).outcome


def test_a_bound_never_hides_a_change():
    faster = [-0.05 + x / 10 for x in D]  # 5 % faster, tight
    d = decide(faster, sequential_design(6, 40, 0.05), 0.01, bound=(0.99, 1.01))
    assert d.outcome is Verdict.FASTER  # the blocks' change stands; the contradiction is the calibration's to find


def test_the_bounded_verdict_reads_and_writes_its_words():
    assert Verdict.BOUNDED.text(margin=0.01) == "equivalent within ±1% (bounded by the trace)"
    assert Verdict.from_text("equivalent within ±1% (bounded by the trace)") is Verdict.BOUNDED
    assert Verdict.BOUNDED.decided and not Verdict.BOUNDED.changed_speed
    assert Verdict.BOUNDED.color not in {Verdict.EQUIVALENT.color, Verdict.UNDECIDED.color}


# --- the engine: a bound that decides times no block ----------------------------------------------------------------


@pytest.mark.slow
def test_an_ab_the_bound_decides_times_no_block_and_reads_back_the_same(tmp_path, monkeypatch):
    """The plumbing from the bound to the result, its page and `--restat`, on the CPU: a CPU trace has no GPU work to
    read a bound from, so the bound's inputs stand in for those of a GPU-bound call (its arithmetic is tested above,
    and its premise on a GPU by `benchmarks/bound_calibration.py`)."""
    from lab import cli
    from lab.measure import ab
    from lab.results import restat, store

    def read_bound(built, control, test, config, profile, prior, progress):
        walls = {"control": CALLS, "test": [w - 0.5 for w in CALLS]}
        busy = {"control": [999.0, 999.3], "test": [998.8, 999.1]}
        found = trace_bound(walls["control"], walls["test"], busy["control"], busy["test"], config.margin)
        return {**found.to_dict(), "walls_ms": walls, "busy_ms": busy}

    monkeypatch.setattr(ab, "read_bound", read_bound)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["ab", "--fix", "unipc_stack", "--pipeline", "wan", "--repeat", "1", "--profile-calls", "2",
                     "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")])
    assert code == 0
    path = tmp_path / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    result = store.read(path)
    assert result.verdict is Verdict.BOUNDED and result.stopped == "bounded" and not result.timed
    assert result.bound.decided and result.stats is None
    assert result.verdict_text == "equivalent within ±1% (bounded by the trace)"
    page = path.with_suffix(".md").read_text()
    assert "**Verdict: equivalent within ±1% (bounded by the trace)**" in page and "The trace's bound:" in page
    again = restat.redecide(result, result.config, result.fixes)
    assert again["verdict"] is Verdict.BOUNDED

"""The estimate of a campaign's job (`lab.campaigns.estimates`) on literal results: a pure function of what was
measured before, given as a `Measured` (no file is read), so that each figure follows from the literal calls,
phases and blocks of the results it is given."""

import msgspec
import pytest

from lab.campaigns.cells import Cell, Job
from lab.campaigns.estimates import GUESS, PROFILER_SLOWDOWN, estimate
from lab.campaigns.measured import Measured, calls_per_block
from lab.results import store
from lab.results.outcome import ArmSamples, Samples
from tests.conftest import DATA, ROOT

#: a stored A/B whose every field the estimate reads is written over below
TEMPLATE = DATA / "results/ab/flux/model_offload_keep_host__eager__full-decode-model_cpu_offload__h200.json"


def cell(*fixes: str, **options) -> Cell:
    """An A/B cell of FLUX.1 at 8 blocks in group offloading, with `options` over those."""
    chosen = {"mode": "eager", "size": "full", "layers": 8, "setting": "group_offload:block_level", **options}
    return Cell("ab", "flux", fixes, tuple(sorted(chosen.items())), 1)


def ab(of: Cell, device: str = "h200", control: float = 10.0, test: float | None = None, blocks: int = 3,
       block_s: float | None = None, **fields):
    """An A/B result of cell `of` measured on `device`: `blocks` blocks of two calls per arm, `control` and `test`
    seconds each (the test arm's the control's unless given), each block `block_s` seconds, 40 s of build, 30 s of
    warm-up and 50 s of verification; `fields` over those."""
    test = control if test is None else test

    def arm(seconds: float) -> ArmSamples:
        return ArmSamples(wall_ms=[seconds * 1e3] * blocks, raw_wall_ms=[[seconds * 1e3] * 2] * blocks)

    literal = {"name": of.stem(device), "fixes": list(of.fixes), "base": of.base, "mode": of.mode, "build_s": 40.0,
               "samples": Samples(control=arm(control), test=arm(test)), "order": [["C", "T"]] * blocks,
               "block_s": [block_s or 4 * (control + test) / 2 + control] * blocks, "profile": None, "verify": None,
               "phase_s": {"warmup": 30.0, "verify": 50.0, "call": control}, "stopped": "max blocks"}
    return msgspec.structs.replace(store.read(TEMPLATE), **{**literal, **fields})


def test_a_job_with_nothing_measured_is_a_stated_guess():
    job = Job((cell("no_progress_bar"),))
    planned = estimate(job, Measured())
    build = GUESS["build"]["full"]
    assert planned.basis == "guess: nothing measured at this setting"
    assert planned.seconds == build + GUESS["cell"]["full"]
    # a time limit ends it as by a Ctrl-C after its set-up and one block, both guessed
    assert planned.least == build + GUESS["block"] and planned.again == build


def test_a_cell_without_a_result_runs_both_arms_at_another_fix_s_control_calls():
    other = ab(cell("hook_registry_cache"))
    (planned_cell,) = cells = (cell("no_progress_bar", max_blocks=12, profile=False),)
    planned = estimate(Job(cells), Measured(at_setting=(other,)))
    block = calls_per_block(planned_cell) * 10.0  # its lead-in and two timed calls per arm, at the control's calls
    assert planned.basis == f"10,000 ms calls measured in {other.name}; at most 12 blocks per cell"
    assert planned.seconds == pytest.approx(40.0 + 30.0 + 50.0 + 12 * block)  # build, set-up, the design's most
    assert planned.least == pytest.approx(40.0 + 30.0 + 50.0 + block) and planned.step == pytest.approx(block)
    # profiled, with no profile's time measured: each pair at PROFILER_SLOWDOWN plain calls per call
    profiled = estimate(Job((cell("no_progress_bar", max_blocks=12, profile_calls=2),)), Measured(at_setting=(other,)))
    assert profiled.seconds - planned.seconds == pytest.approx(2 * 2 * PROFILER_SLOWDOWN * 10.0)


def test_a_cell_goes_on_from_its_own_blocks_only_on_the_gpu_that_measured_them():
    mine = cell("no_progress_bar", max_blocks=12, profile=False)
    own = ab(mine, device="h200", block_s=62.0, stopped="budget spent")
    going_on = estimate(Job((mine,)), Measured(at_setting=(own,)), resume=True, device="h200")
    assert going_on.basis == "this cell's 3 blocks so far, 62 s each; at most 9 more"
    assert going_on.seconds == pytest.approx(40.0 + 30.0 + 50.0 + 9 * 62.0)
    # on another GPU its blocks say what a block takes, scaled to the calls there, but a run starts afresh
    elsewhere = estimate(Job((mine,)), Measured(at_setting=(own,)), resume=True, device="h100")
    assert elsewhere.basis.startswith(f"62 s blocks from {own.name}, this cell on another GPU, at 10,000 ms")
    assert elsewhere.seconds == pytest.approx(40.0 + 30.0 + 50.0 + 12 * 62.0)


def test_a_part_s_blocks_scale_to_the_control_calls_of_the_newest_result():
    """A result over some of the cell's fixes times its blocks at its own control calls; the newest result's control
    calls, twice as long, make them twice as long."""
    part = ab(cell("no_progress_bar"), control=10.0, test=5.0, block_s=40.0)
    newer = ab(cell("hook_registry_cache"), control=20.0)
    planned = estimate(Job((cell("hook_registry_cache", "no_progress_bar", max_blocks=12, profile=False),)),
                       Measured(at_setting=(part, newer)))
    assert planned.step == pytest.approx(2 * 40.0)
    assert planned.basis.startswith(f"80 s blocks from {part.name}, over some of its fixes, at 20,000 ms control "
                                    "calls (its own: 10,000 ms)")


def test_another_kind_of_job_is_planned_from_the_run_logs():
    options = tuple(sorted({"mode": "eager", "size": "full", "layers": 2}.items()))
    census = Job((Cell("census", "wan", (), options, 1),))
    log = ({"job": census.id, "exit": 0, "seconds": 120.0}, {"job": census.id, "exit": 1, "seconds": 5.0},
           {"job": "census-wan-eager-full-aa", "exit": 0, "seconds": 60.0},
           {"job": "census-wan_v2v-eager-full-aa", "exit": 0, "seconds": 999.0})
    assert estimate(census, Measured(log=log)).seconds == 120.0  # its own finished run, not the failed one
    alike = estimate(census, Measured(log=log[1:]))  # the same kind, pipeline and mode, not another pipeline's
    assert alike.seconds == 60.0 and alike.basis.startswith("other census jobs of wan eager took 60 s (median of 1")
    assert estimate(census, Measured()).basis == "guess (no estimate for this kind yet)"


def test_the_campaign_file_s_minutes_are_the_whole_and_its_results_the_shortest_run():
    mine = cell("no_progress_bar", minutes=30)
    planned = estimate(Job((mine,)), Measured(at_setting=(ab(mine),)))
    assert planned.seconds == 30 * 60.0 and planned.basis == "the campaign file's own estimate"
    assert planned.least == pytest.approx(40.0 + 30.0 + 50.0 + 2 * PROFILER_SLOWDOWN * 10.0)  # a first pair


def test_a_cell_planned_from_a_part_that_decided_a_change_is_expected_at_that_part_s_blocks():
    """A set planned from a result of some of its fixes that decided a change larger than the margin (the statistics of
    Qwen-Image's committed `model_offload_pinned`, decided 0.0594x) is expected to stop at the blocks that result took, not at its design's
    most; the estimate keeps the design's most as its figure and states the expected one beside it. A part whose
    interval stays within the margin tells nothing of when the set decides."""
    decided = store.read(ROOT / "results/ab/qwenimage/model_offload_pinned__compile__full-8l-model_cpu_offload__h200.json")
    assert decided.verdict.changed_speed and decided.stats.ci[1] < 0.99
    blocks = max(decided.stats.n, 6)
    part = ab(cell("no_progress_bar"), control=10.0, test=5.0, block_s=40.0, stats=decided.stats,
              verdict=decided.verdict)
    job = Job((cell("hook_registry_cache", "no_progress_bar", max_blocks=40, profile=False),))
    planned = estimate(job, Measured(at_setting=(part,)))
    assert planned.seconds - planned.expected == pytest.approx((40 - blocks) * 40.0)
    within = msgspec.structs.replace(decided.stats, ci=(0.995, 1.004))
    assert estimate(job, Measured(at_setting=(msgspec.structs.replace(part, stats=within),))).expected is None
    # a cell of a fixed number of blocks times them whatever its parts did
    fixed = Job((cell("hook_registry_cache", "no_progress_bar", blocks=20, profile=False),))
    assert estimate(fixed, Measured(at_setting=(part,))).expected is None

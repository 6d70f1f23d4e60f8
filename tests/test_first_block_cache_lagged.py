"""`first_block_cache_lagged`: the first-block cache decides one call late, from a ratio the host never waits for.

The fix changes what the cache skips on purpose, so it is checked for that: its decisions are upstream's one
transformer call later (the real hook, the rewrite installed), `all` and the joint set of `each` leave it out (it is
compared alone), and an A/B of it times it with the outputs' difference as a warning instead of refusing it. What it
saves (the wait for the first block in every transformer call) is for `lab ab` on a GPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from lab.apply.fix import applied, catalog, check_fixes_for, each_sets, exercised, get_fix
from lab.apply.patching import CallCounter
from lab.run.scenario import build, get_scenario

SETTING = "first_block_cache (threshold=0.2)"


def decisions(ratios: list[float], threshold: float = 0.2) -> list[bool]:
    """What the head block's hook decides for residuals whose ratio to the reference is each of `ratios`."""
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook, FBCSharedBlockState
    from diffusers.hooks.hooks import StateManager

    manager = StateManager(FBCSharedBlockState)
    manager.set_context("cond")
    hook = FBCHeadBlockHook(manager, threshold)
    reference = torch.ones(4)
    manager.get_state().head_block_residual = reference
    return [hook._should_compute_remaining_blocks(reference * (1 + r)) for r in ratios]


def test_it_decides_from_the_previous_calls_ratio():
    ratios = [0.1, 0.5, 0.05, 0.05, 0.3]
    upstream = decisions(ratios)
    assert upstream == [False, True, False, False, True]
    fix = get_fix("first_block_cache_lagged")
    built = build(get_scenario("flux"), size="tiny", device="cpu")
    counter = CallCounter()
    with applied([fix], built.pipe, counter):
        lagged = decisions(ratios)
    assert lagged == [True] + upstream[:-1]  # the first computes (no ratio on the host yet), then one call late
    assert exercised(fix, counter) == len(ratios)
    assert decisions(ratios) == upstream  # given back


def test_all_leaves_it_out_and_each_compares_it_alone():
    fix = get_fix("first_block_cache_lagged")
    assert fix.changes_outputs
    sets = [[f.name for f in fixes] for fixes, _ in each_sets("flux", [SETTING])]
    assert ["first_block_cache_lagged"] in sets and all("first_block_cache_lagged" not in s for s in sets if len(s) > 1)
    keep, notes = check_fixes_for("flux", list(catalog().values()), skip_inapplicable=True, settings=[SETTING])
    assert "first_block_cache_lagged" not in [f.name for f in keep]
    assert any("`first_block_cache_lagged` changes what the pipeline computes" in n for n in notes)
    named, _ = check_fixes_for("flux", [fix], skip_inapplicable=False, settings=[SETTING])
    assert named == [fix]  # named, it runs


def test_an_ab_of_it_is_timed_with_the_difference_as_a_warning(tmp_path):
    """A threshold that upstream's cache meets in the second call (it skips there) and the lagged one does not (no
    ratio on the host yet): the outputs differ, and the A/B times the two arms anyway, saying by how much."""
    from lab import cli

    argv = ["ab", "--fix", "first_block_cache_lagged", "--pipeline", "flux", "--setting",
            "first_block_cache:threshold=10", "--blocks", "2", "--repeat", "1", "--no-profile",
            "--out", str(tmp_path), "--trace-dir", str(tmp_path / "traces")]
    assert cli.main(argv) == 0
    (path,) = (tmp_path / "flux").glob("first_block_cache_lagged__*.json")
    result = json.loads(path.read_text())
    assert not result["verify"]["within_tolerance"] and result["verify"]["max_abs_diff"] > 0
    assert result["verdict"] != "outputs differ" and len(result["order"]) == 2
    own = result["verify"]["setting_moves"]  # the cache itself against no cache: the scale the difference reads on
    assert own > 0
    # what each arm's cache decided in its verifying call (4 transformer calls): upstream skips from the second
    # call, the lagged rule from the third
    assert result["verify"]["decisions"] == {
        "control": {"first_block_cache: computed": 1, "first_block_cache: skipped": 3},
        "test": {"first_block_cache: computed": 2, "first_block_cache: skipped": 2}}
    page = path.with_suffix(".md").read_text()
    assert ("in each arm's verifying call (transformer calls): control: first_block_cache computed 1, skipped 3; "
            "test: first_block_cache computed 2, skipped 2.") in page
    assert any(w.startswith("the outputs differ by up to") and "as `first_block_cache_lagged` means them to" in w
               and f"the setting itself moves them by up to {own:.3g} (a call without it)" in w
               for w in result["warnings"])


def test_a_call_without_the_cache_turns_it_on_again_as_built():
    from lab.run.settings import hook_count, without

    built = build(get_scenario("flux"), size="tiny", device="cpu", settings=["first_block_cache:threshold=10"])
    cached = built().images
    hooks = hook_count(built.pipe.transformer)
    plain = without(built.chosen_settings, built, lambda: built().images)
    assert hooks > 0 and not torch.equal(plain, cached)  # at 10 the cache skips from the second call on
    assert hook_count(built.pipe.transformer) == hooks and torch.equal(built().images, cached)  # on again, the same
    built.undo_settings()
    assert hook_count(built.pipe.transformer) == 0  # the new undo turns off what was turned on again
    # a LoRA's or MagCache's would be made anew (new weights, ratios measured again): no call without them
    from lab.run.settings import parse

    for other in ("lora:rank=4", "mag_cache"):
        assert without([parse(other)], built, lambda: pytest.fail("called")) is None

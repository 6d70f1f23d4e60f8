"""Numerically equivalent is not "outputs differ": the rule on literal errors, the reference that gives the pipeline
its own tensors back, and the whole check on a tiny Wan with two real changes, one that only rounds differently and
one that changes what is computed."""

import math

import pytest
import torch

from lab.apply import change
from lab.measure.ab import Arm
from lab.measure.verify import verify
from lab.run.reference import recorded_noise, relative_error, replayed_noise, upcast
from lab.run.runner import timed_call
from lab.run.scenario import build, get_scenario
from lab.verdicts import numerics
from tests.conftest import ROOT

CHANGES = ROOT / "tests" / "data" / "changes"


# --- the rule, on literal errors -------------------------------------------------------------------------------------


def test_an_error_of_the_controls_size_is_rounding_and_a_larger_one_is_not():
    assert numerics.judge(3.0e-7, 3.9e-7, "float64").label == numerics.EQUIVALENT
    assert numerics.judge(3.0e-7, 5.9e-7, "float64").label == numerics.EQUIVALENT  # just under twice
    assert numerics.judge(3.0e-7, 6.1e-7, "float64").label == numerics.DIFFER
    assert numerics.judge(2.0e-3, 1.0e-3, "float32").label == numerics.EQUIVALENT  # smaller than the control's
    found = numerics.judge(2.0e-3, 1.4e-4 * 1000, "float32")
    assert found.label == numerics.DIFFER and "more than rounding" in found.reason and found.bound == 4.0e-3


def test_nan_never_passes_and_a_control_far_from_its_reference_cannot_tell():
    assert numerics.judge(1e-3, math.nan, "float32").label == numerics.DIFFER
    assert numerics.judge(math.inf, 1e-3, "float32").label == numerics.DIFFER
    far = numerics.judge(0.3, 0.3, "float32")
    assert far.label == numerics.DIFFER and "cannot tell" in far.reason


def test_a_control_that_is_its_reference_leaves_a_floor_of_the_references_rounding():
    eps = numerics.EPSILON["float64"]
    assert numerics.judge(0.0, 4 * eps, "float64").label == numerics.EQUIVALENT
    assert numerics.judge(0.0, 1e-9, "float64").label == numerics.DIFFER


def test_relative_error():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(torch.tensor([3.0, 4.0]), ref) == 0.0
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert math.isnan(relative_error(torch.tensor([math.nan, 4.0]), ref))


# --- the reference on a real tiny pipeline ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built():
    return build(get_scenario("wan"), size="tiny", device="cpu")


def _tensors(built):
    return [t for c in built.pipe.components.values() if isinstance(c, torch.nn.Module)
            for t in [*c.parameters(), *c.buffers()]]


def test_upcasting_gives_every_tensor_its_own_storage_back_even_on_an_error(built):
    before = [(t.data_ptr(), t.dtype, t.detach().clone()) for t in _tensors(built)]
    with pytest.raises(RuntimeError, match="half-way"):
        with upcast(built, torch.float64) as up:
            assert all(t.dtype == torch.float64 for t in _tensors(built) if t.is_floating_point())
            assert all(v.dtype == torch.float64 for v in up.prompt_kwargs.values()
                       if isinstance(v, torch.Tensor) and v.is_floating_point())
            raise RuntimeError("half-way")
    after = _tensors(built)
    assert [(t.data_ptr(), t.dtype) for t in after] == [(p, d) for p, d, _ in before]
    assert all(torch.equal(t, v) for t, (_, _, v) in zip(after, before))


def test_the_reference_starts_from_the_arms_own_noise(built):
    tape: list[torch.Tensor] = []
    with recorded_noise(tape):
        timed_call(built, seed=0, marks=False)
    assert tape, "the call drew its latents through randn_tensor"
    used = [0]
    with upcast(built, torch.float64) as up, replayed_noise(tape, used):
        timed_call(up, seed=1, marks=False)  # another seed: the latents still come from the tape
    assert used[0] == len(tape)


# --- the whole check on two real changes -----------------------------------------------------------------------------


def _check(built, diff: str) -> dict:
    fix, _ = change.load([CHANGES / diff])
    return verify(built, Arm("control", []), Arm("test", [fix]), seed=0)


def test_a_change_that_only_rounds_differently_is_numerically_equivalent(built):
    checked = _check(built, "wan_modulation_reordered.diff")
    assert not checked["identical"] and checked["max_abs_diff"] > 0
    found = checked["numerics"]
    assert found["label"] == numerics.EQUIVALENT and checked["within_tolerance"]
    assert found["test_error"] <= 2 * found["control_error"] and found["noise_replayed"] == "1 of 1"


def test_a_change_of_what_is_computed_still_differs(built):
    checked = _check(built, "wan_modulation_scaled.diff")
    found = checked["numerics"]
    assert found["label"] == numerics.DIFFER and not checked["within_tolerance"]
    assert found["test_error"] > 100 * found["control_error"]

"""`model_offload_pinned` on the CPU, with stand-ins for the pinned memory and for the device copies.

A CPU build of torch has no pinned memory, so the fix's one allocation of it (`pinned_bytes`) gives plain host
buffers here, counted; the device copies are the stand-in of `tests/test_model_offload_keep_host.py` (a move to the
"device" is a real copy, and it notes a move that does not wait). Upstream's hooks and the fix's runtime part run for
real on a tiny FLUX.1 under `enable_model_cpu_offload`. What the pinned, non-blocking moves save on a GPU is for
`lab ab --setting model_cpu_offload` there.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fixes._offload as pinned_blocks
import fixes.model_offload_pinned as pinned_fix
from lab.apply.fix import applied, each_sets, exercised, get_fix
from lab.apply.patching import CallCounter
from lab.run.scenario import build, get_scenario
from tests.conftest import diffusers_release
from tests.test_model_offload_keep_host import (ACCELERATE_DIFF, cast_after_enabling, cast_before_offloading,
                                                two_devices)

REPO = Path(__file__).resolve().parents[1]
PINNED_DIFF = REPO / "patches" / "accelerate" / "model_offload_pinned.diff"
DIFFUSERS_DIFF = REPO / "patches" / "accelerate" / "model_offload_pinned_diffusers.diff"
#: the end of a call offloads through the hooks (`model_offload_keep_host`'s diffusers follow-up)
FREE_HOOKS_DIFF = REPO / "patches" / "accelerate" / "model_offload_keep_host_diffusers.diff"


@pytest.fixture
def pinned(monkeypatch):
    """Plain buffers for pinned ones, small blocks (so that a tiny model fills several, and some weights exceed
    one), and the fix's caches fresh: returns the sizes asked for."""
    asked: list[int] = []

    def plain(nbytes: int) -> torch.Tensor:
        asked.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(pinned_blocks, "pinned_bytes", plain)
    monkeypatch.setattr(pinned_blocks, "BLOCK", 1 << 14)  # tiny FLUX.1: 66 weights of 16 B to 32 KiB, 304 KiB
    monkeypatch.setattr(pinned_blocks, "_blocks", [])
    monkeypatch.setattr(pinned_blocks, "_PINNED", {})
    return asked


@pytest.fixture(scope="module")
def offloaded():
    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    built.pipe.enable_model_cpu_offload(device="cpu")
    return built, reference


def test_weights_move_from_pinned_copies_without_a_wait_and_never_come_back(offloaded, pinned):
    from accelerate.hooks import CpuOffload

    built, reference = offloaded
    fix = get_fix("model_offload_pinned")
    params = list(built.pipe.transformer.parameters())
    pageable = [p.data_ptr() for p in params]
    originals = {name: CpuOffload.__dict__.get(name) for name in ("pre_forward", "init_hook", "detach_hook")}
    moves: collections.Counter = collections.Counter()
    counter = CallCounter()
    with applied([fix], built.pipe, counter), two_devices(moves):
        outputs = [built().images for _ in range(2)]
        on_pinned = [p.data_ptr() for p in params]
    assert all(torch.equal(out, reference) for out in outputs)
    assert moves["to the device"] == 2 * len(params)
    assert moves["to the device without a wait"] == moves["to the device"]  # every weight moves without a wait
    assert moves["back to the host"] == 0  # and none comes back: pointed back at its pinned copy
    assert exercised(fix, counter) == 2
    # between the calls the weights sat in the pinned blocks, copied once; some weights exceed a block
    assert not set(on_pinned) & set(pageable)
    assert sum(pinned) >= sum(p.numel() * p.element_size() for p in params)
    assert any(n > pinned_blocks.BLOCK for n in pinned) and pinned.count(pinned_blocks.BLOCK) >= 2
    # given back: the hook's class, and each parameter on its pageable tensor again
    assert {name: CpuOffload.__dict__.get(name) for name in originals} == originals
    assert [p.data_ptr() for p in params] == pageable
    again: collections.Counter = collections.Counter()
    with two_devices(again):
        assert torch.equal(built().images, reference)
    assert again["back to the host"] == len(params) and again["to the device without a wait"] == 0  # upstream's


def test_a_second_turn_reuses_the_pinned_copies_and_a_changed_weight_is_copied_again(offloaded, pinned):
    built, reference = offloaded
    fix = get_fix("model_offload_pinned")
    first = next(built.pipe.transformer.parameters())
    with applied([fix], built.pipe), two_devices(collections.Counter()):
        built()
    asked = len(pinned)
    with applied([fix], built.pipe), two_devices(collections.Counter()):
        built()
    assert len(pinned) == asked  # the A/B's arm switches copy nothing again
    original = first.data
    first.data = original.clone()  # a weight a user changes between calls (a LoRA fused, say)
    try:
        with applied([fix], built.pipe), two_devices(collections.Counter()):
            assert torch.equal(built().images, reference)
            assert torch.equal(pinned_fix.pinned_of(first)[0], original)
        assert pinned_fix.pinned_of(first)[1].data_ptr() == first.data.data_ptr()  # a copy of the new tensor
    finally:
        first.data = original


def test_after_the_other_arms_calls_a_turn_pins_again_into_the_same_space_before_its_call(offloaded, pinned):
    """An A/B's control calls copy the weights back into new pageable tensors (upstream's offload): the next turn of
    the fix copies them into the pinned space it had, at its switch-on (outside the call it times), allocating
    nothing (the first GPU run, which pinned inside each call and anew each turn, ran a host out of memory)."""
    built, reference = offloaded
    fix = get_fix("model_offload_pinned")
    params = list(built.pipe.transformer.parameters())
    with applied([fix], built.pipe), two_devices(collections.Counter()):
        assert [p.data_ptr() for p in params] == [pinned_fix.pinned_of(p)[0].data_ptr() for p in params]  # at once
        built()
    asked, views = len(pinned), [pinned_fix.pinned_of(p)[0].data_ptr() for p in params]
    moves: collections.Counter = collections.Counter()
    with two_devices(moves):
        built()  # the other arm: upstream's offload
    assert moves["back to the host"] == len(params) and not {p.data_ptr() for p in params} & set(views)
    with applied([fix], built.pipe), two_devices(collections.Counter()):
        assert [p.data_ptr() for p in params] == views
        assert torch.equal(built().images, reference)
    assert len(pinned) == asked


def test_it_conflicts_with_keep_host_and_runs_only_in_model_cpu_offload():
    sets = [[f.name for f in fixes] for fixes, _ in each_sets("flux", ["model_cpu_offload"])]
    assert ["model_offload_pinned"] in sets and ["model_offload_keep_host"] in sets
    assert not any({"model_offload_pinned", "model_offload_keep_host"} <= set(s) for s in sets)
    assert all("model_offload_pinned" not in s for fixes, _ in each_sets("flux", ["lora (rank=16)"])
               for s in [[f.name for f in fixes]])


@pytest.mark.parametrize("when", ["offloaded", "on the device"])
def test_a_model_cast_after_offloading_was_enabled_runs_in_its_new_dtype(pinned, when):
    """A cast while the model is offloaded points its parameters away from their pinned copies, and the next move pins
    the new tensors; one while it is on the device is left to the copy back, and pinned at the next move. The forwards
    run in bfloat16 with upstream's outputs, and what the fix gives back on exit is the cast model (giving back the
    float32 tensors it pinned from, or pointing back at the float32 pinned copies, fails a forward with a dtype
    mismatch)."""
    expected = cast_before_offloading()
    fix, counter = get_fix("model_offload_pinned"), CallCounter()
    assert all(torch.equal(out, expected) for out in cast_after_enabling([fix], when, counter))
    assert exercised(fix, counter) == 3  # each offload after a move took its path


#: the start of a script run on patched releases: a CPU build of torch has no pinned memory, so plain buffers stand
#: in for it (`pinned` lists them) and know themselves pinned; `refused` says what enabling an option that the
#: installed accelerate lacks raises
PINNED_STAND_IN = """
import torch

pinned = []  # a CPU build of torch has no pinned memory: plain buffers stand in, and know themselves pinned
real_empty = torch.empty
def empty(*args, pin_memory=False, **kwargs):
    out = real_empty(*args, **kwargs)
    if pin_memory:
        pinned.append(out)
    return out
torch.empty = empty
torch.Tensor.is_pinned = lambda self: any(
    b.data_ptr() <= self.data_ptr() < b.data_ptr() + b.numel() for b in pinned if self.numel())

def refused(module, name, without_option, enable):
    # the error `enable()` raises while `module.name` is `without_option` (accelerate's function as released, with
    # no `pin_memory`), or None; `module.name` is given back after
    real = getattr(module, name)
    setattr(module, name, without_option)
    try:
        enable()
        return None
    except ValueError as error:
        return str(error)
    finally:
        setattr(module, name, real)
"""

UPSTREAM_RUN = PINNED_STAND_IN + """
import collections, json
import accelerate, torch
from accelerate.hooks import CpuOffload
from lab.run.scenario import build, get_scenario
from tests.test_model_offload_keep_host import two_devices

built = build(get_scenario("flux"), size="tiny", device="cpu")
reference = built().images
# an accelerate without the option: the diffusers diff refuses `pin_memory=True` in one clear error
refusal = refused(accelerate, "cpu_offload_with_hook", lambda model, execution_device=None, prev_module_hook=None: 1 / 0,
                  lambda: built.pipe.enable_model_cpu_offload(device="cpu", pin_memory=True))
built.pipe.enable_model_cpu_offload(device="cpu", pin_memory=True)  # the diffusers diff passes it on
params = list(built.pipe.transformer.parameters())
at_enable = len(pinned)
moves = collections.Counter()
with two_devices(moves):
    host = [p.data_ptr() for p in params]
    outputs = [built().images for _ in range(2)]
    same = [p.data_ptr() for p in params] == host
import diffusers
print(json.dumps({"patched": "pin_memory" in CpuOffload.__init__.__code__.co_varnames, "params": len(params),
                  "diffusers": diffusers.__version__, "refused": refusal,
                  "pinned at enable": at_enable > 0 and all(p.is_pinned() for p in params),
                  "pinned in the calls": len(pinned) - at_enable,
                  "to the device": moves["to the device"], "without a wait": moves["to the device without a wait"],
                  "back to the host": moves["back to the host"], "pointed back": same,
                  "equal": all(torch.equal(o, reference) for o in outputs)}))
"""


@pytest.mark.slow
def test_the_upstream_diffs_apply_to_their_releases_and_move_from_pinned_memory_without_a_wait(tmp_path):
    """The upstream change is two diffs: `patches/accelerate/model_offload_pinned.diff` applies to accelerate 1.15.0
    after `model_offload_keep_host.diff` (it is the second of the two changes), and
    `model_offload_pinned_diffusers.diff` to diffusers 0.42.1 (the newest release), which passes `pin_memory` from
    `enable_model_cpu_offload` to accelerate and keeps it when `maybe_free_model_hooks` enables offloading again at
    the end of each call, there after `model_offload_keep_host_diffusers.diff` (the end of the call offloads
    through the hooks, which point the weights back). With them, and without the lab's fix, a tiny FLUX.1 pins its weights once, when offloading
    is enabled, moves them without a wait in both calls (the second through the hooks the first call's end made) and
    never copies them back, with the same outputs; an accelerate without the option is refused in one clear error."""
    import accelerate

    assert accelerate.__version__ == "1.15.0"  # the release the diffs are against: pin and diff move together
    shutil.copytree(Path(accelerate.__file__).parent, tmp_path / "accelerate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(diffusers_release("0.42.1") / "diffusers", tmp_path / "diffusers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for diff in (ACCELERATE_DIFF, PINNED_DIFF, FREE_HOOKS_DIFF, DIFFUSERS_DIFF):
        applied_diff = subprocess.run(["git", "apply", "-p2", str(diff)], cwd=tmp_path, capture_output=True, text=True)
        assert applied_diff.returncode == 0, (diff.name, applied_diff.stderr)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    run = subprocess.run([sys.executable, "-c", UPSTREAM_RUN], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    n = seen["params"]
    assert seen["refused"].startswith("`enable_model_cpu_offload(pin_memory=True)` requires a version of `accelerate`")
    assert seen == {"patched": True, "params": n, "diffusers": "0.42.1", "refused": seen["refused"],
                    "pinned at enable": True, "pinned in the calls": 0, "to the device": 2 * n,
                    "without a wait": 2 * n, "back to the host": 0, "pointed back": True, "equal": True}

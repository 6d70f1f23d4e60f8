"""`sequential_offload_pinned` and `sequential_offload_keep_cache` on the CPU, under accelerate's sequential offload.

diffusers' `enable_sequential_cpu_offload(device="cpu")` cannot run on a CPU (its execution device `cpu:0` makes each
load a copy that is no longer a `Parameter`, and accelerate's move back to `meta` fails on it), so a tiny FLUX.1
transformer gets the same hooks from accelerate's `cpu_offload` with the plain `cpu` device, which is what
`enable_sequential_cpu_offload` calls for each model, and runs one forward. A CPU build of torch has no pinned memory: plain buffers stand in
for it and know themselves pinned. What the loads save on a GPU is for `lab ab --setting sequential_cpu_offload`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import fixes._offload as pinned_blocks
import fixes.sequential_offload_keep_cache as keep_cache_fix
import fixes.sequential_offload_pinned as pinned_fix
from lab.apply.fix import applied, get_fix
from lab.apply.patching import CallCounter
from tests.conftest import diffusers_release
from tests.test_fix_numerics import flux_inputs, tiny_flux
from tests.test_model_offload_pinned import PINNED_STAND_IN

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches" / "accelerate"


@pytest.fixture
def pinned(monkeypatch):
    """Plain buffers for pinned ones (small blocks, so that a tiny model fills several), which `is_pinned` knows;
    the fixes' caches fresh. Returns the buffers given out."""
    given: list[torch.Tensor] = []
    real_is_pinned = torch.Tensor.is_pinned

    def plain(nbytes: int) -> torch.Tensor:
        given.append(torch.empty(nbytes, dtype=torch.uint8))
        return given[-1]

    def is_pinned(self, *args, **kwargs):
        return any(b.data_ptr() <= self.data_ptr() < b.data_ptr() + b.numel() for b in given if self.numel()) \
            or real_is_pinned(self, *args, **kwargs)

    monkeypatch.setattr(pinned_blocks, "pinned_bytes", plain)
    monkeypatch.setattr(pinned_blocks, "BLOCK", 1 << 14)
    monkeypatch.setattr(pinned_blocks, "_blocks", [])
    monkeypatch.setattr(pinned_fix, "_PINNED", {})
    monkeypatch.setattr(torch.Tensor, "is_pinned", is_pinned)
    return given


class Offloaded:
    """A tiny FLUX.1 transformer that accelerate offloads leaf module by leaf module, as the one component of a
    pipeline (`pipe.components`, where the fixes look for the offload hooks); calling it runs one forward."""

    def __init__(self):
        from accelerate import cpu_offload

        self.transformer = tiny_flux()
        self.components = {"transformer": self.transformer}
        self.reference = self()
        cpu_offload(self.transformer, execution_device=torch.device("cpu"))

    def __call__(self) -> torch.Tensor:
        with torch.no_grad():
            return self.transformer(**flux_inputs())[0]


@pytest.fixture(scope="module")
def sequential():
    offloaded = Offloaded()
    return offloaded, offloaded.reference


@pytest.fixture
def loads(monkeypatch):
    """Every `set_module_tensor_to_device` call the hooks make, with what the fixes pass on: (device, value,
    non_blocking, clear_cache)."""
    import accelerate.hooks as hooks

    seen: list[tuple] = []
    real = hooks.set_module_tensor_to_device

    def recorded(module, tensor_name, device, value=None, *args, **kwargs):
        seen.append((str(device), value, kwargs.get("non_blocking", False), kwargs.get("clear_cache", True)))
        return real(module, tensor_name, device, value, *args, **kwargs)

    monkeypatch.setattr(hooks, "set_module_tensor_to_device", recorded)
    return seen


def test_the_weights_load_from_pinned_copies_without_a_wait_and_the_state_dict_is_given_back(sequential, pinned,
                                                                                              loads):
    pipe, reference = sequential
    (state,) = pinned_fix.weights_maps(pipe)
    before = dict(state)
    counter = CallCounter()
    with applied([get_fix("sequential_offload_pinned")], pipe, counter=counter):
        assert all(state[k].is_pinned() and torch.equal(state[k], v) for k, v in before.items())
        images = pipe()
    weights = [(d, v, nb) for d, v, nb, _ in loads if v is not None]
    assert weights and all(nb and v.is_pinned() for _, v, nb in weights)  # every load, from pinned memory
    assert counter.counts[pinned_fix.EXERCISED] == len(weights)
    assert all(not nb for d, v, nb, _ in loads if v is None)  # the moves back to `meta` are as before
    assert torch.equal(images, reference)
    assert all(state[k] is v for k, v in before.items())  # the pageable tensors again, the same objects
    # a second turn finds its pinned copies (nothing allocated), and a changed weight is copied again
    blocks = len(pinned)
    key = next(iter(before))
    saved = state[key].clone()
    state[key].add_(1)
    try:
        with applied([get_fix("sequential_offload_pinned")], pipe):
            assert len(pinned) == blocks and torch.equal(state[key], before[key])
    finally:
        state[key].copy_(saved)


def test_the_loads_keep_the_device_cache(sequential, loads):
    import accelerate.hooks as hooks

    pipe, reference = sequential
    recorder = hooks.set_module_tensor_to_device
    counter = CallCounter()
    with applied([get_fix("sequential_offload_keep_cache")], pipe, counter=counter):
        images = pipe()
    weights = [cc for _, v, _, cc in loads if v is not None]
    assert weights and not any(weights)  # `clear_cache=False` for every load
    assert counter.counts[keep_cache_fix.EXERCISED] == len(weights)
    assert all(cc for _, v, _, cc in loads if v is None)  # a move to `meta` is passed on as it was
    assert torch.equal(images, reference)
    assert hooks.set_module_tensor_to_device is recorder


def test_the_two_compose(sequential, pinned, loads):
    pipe, reference = sequential
    fixes = [get_fix("sequential_offload_pinned"), get_fix("sequential_offload_keep_cache")]
    with applied(fixes, pipe):
        images = pipe()
    weights = [(nb, cc) for _, v, nb, cc in loads if v is not None]
    assert weights and all(nb and not cc for nb, cc in weights)
    assert torch.equal(images, reference)


@pytest.mark.parametrize("fixes", [(), ("sequential_offload_keep_cache",), ("sequential_offload_pinned",),
                                   ("sequential_offload_pinned", "sequential_offload_keep_cache")])
def test_a_model_cast_after_offloading_was_enabled_runs_in_its_new_dtype(pinned, loads, fixes):
    """`model.to(torch.bfloat16)` after sequential offloading was enabled casts the parameters on `meta`; each load
    casts its host value (a pinned copy, with the fix) to their dtype, so the forwards run in bfloat16 with the outputs
    of the model cast before offloading, with the fixes as without them, and the state dicts stay as they were."""
    from accelerate import cpu_offload

    from tests.test_group_offload_keep_host import flux_inputs, tiny_flux_transformer

    expected = tiny_flux_transformer().to(torch.bfloat16)(**flux_inputs(torch.bfloat16))[0]
    model = tiny_flux_transformer()
    cpu_offload(model, execution_device=torch.device("cpu"))
    pipe = SimpleNamespace(components={"transformer": model})
    (state,) = pinned_fix.weights_maps(pipe)
    before = dict(state)
    with torch.no_grad(), applied([get_fix(name) for name in fixes], pipe):
        model(**flux_inputs(torch.float32))
        model.to(torch.bfloat16)
        outputs = [model(**flux_inputs(torch.bfloat16))[0] for _ in range(2)]
        options = {(nb, cc) for _, v, nb, cc in loads if v is not None}  # each load's, the fixes on
    with torch.no_grad():
        outputs.append(model(**flux_inputs(torch.bfloat16))[0])  # the fixes off
    assert all(torch.equal(out, expected) for out in outputs)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(state[k] is v for k, v in before.items())
    assert options == {("sequential_offload_pinned" in fixes, "sequential_offload_keep_cache" not in fixes)}


def test_they_run_only_in_sequential_offload():
    from lab.apply.fix import each_sets

    sets = [[f.name for f in fixes] for fixes, _ in each_sets("flux", ["sequential_cpu_offload"])]
    assert ["sequential_offload_pinned"] in sets and ["sequential_offload_keep_cache"] in sets
    assert all("sequential_offload_pinned" not in s for fixes, _ in each_sets("flux", ["model_cpu_offload"])
               for s in [[f.name for f in fixes]])


UPSTREAM_RUN = PINNED_STAND_IN + """
import json
import accelerate, torch
import accelerate.hooks as hooks
from fixes.sequential_offload_pinned import weights_maps
from lab.run.scenario import build, get_scenario
from tests.test_fix_numerics import flux_inputs, tiny_flux

loads = []  # (non_blocking, clear_cache) of each load of a weight by the hooks
real_load = hooks.set_module_tensor_to_device
def load(module, name, device, value=None, *args, **kwargs):
    if value is not None:
        loads.append((kwargs.get("non_blocking", False), kwargs.get("clear_cache", True)))
    return real_load(module, name, device, value, *args, **kwargs)
hooks.set_module_tensor_to_device = load

def forward(transformer):
    with torch.no_grad():
        return transformer(**flux_inputs())[0]

# accelerate: cpu_offload(pin_memory=True) on a tiny FLUX.1 transformer, with the plain `cpu` device
transformer = tiny_flux()
reference = forward(transformer)
accelerate.cpu_offload(transformer, execution_device=torch.device("cpu"), pin_memory=True)
(state,) = weights_maps(type("Pipe", (), {"components": {"transformer": transformer}})())
at_offload = len(pinned)
outputs = [forward(transformer) for _ in range(2)]
pinned_in_calls = len(pinned) - at_offload

# diffusers: a pipeline's own enable_sequential_cpu_offload(pin_memory=True); refused where accelerate lacks it
built = build(get_scenario("flux"), size="tiny", device="cpu")
refusal = refused(accelerate, "cpu_offload", lambda model, execution_device=None, offload_buffers=False: 1 / 0,
                  lambda: built.pipe.enable_sequential_cpu_offload(device="cpu", pin_memory=True))
built.pipe.enable_sequential_cpu_offload(device="cpu", pin_memory=True)
maps = weights_maps(built.pipe)
import diffusers
print(json.dumps({"accelerate": "pinned_copies" in dir(hooks), "diffusers": diffusers.__version__,
                  "pinned at offload": at_offload > 0 and all(v.is_pinned() for v in state.values()),
                  "pinned in the calls": pinned_in_calls,
                  "loads": len(loads), "without a wait, cache kept": sum(nb and not cc for nb, cc in loads),
                  "equal": all(torch.equal(o, reference) for o in outputs), "refused": refusal,
                  "pipeline's maps": len(maps), "pipeline's maps pinned": all(
                      v.is_pinned() for m in maps for v in m.values() if v.device.type == "cpu")}))
"""


@pytest.mark.slow
def test_the_upstream_diffs_apply_in_series_and_load_from_pinned_memory_without_a_wait(tmp_path):
    """The upstream change: `patches/accelerate/sequential_offload_keep_cache.diff` and then
    `sequential_offload_pinned.diff` apply to accelerate 1.15.0 after the two model-offload diffs (the pinned one
    shares their `pinned_copies`), and `sequential_offload_pinned_diffusers.diff` to diffusers 0.42.1 after
    `model_offload_pinned_diffusers.diff`. With them, and without the lab's fixes: `cpu_offload(pin_memory=True)` pins
    the state dict once, every load of a weight is without a wait and keeps the cache, in two forwards, with the
    same outputs; a pipeline's `enable_sequential_cpu_offload(pin_memory=True)` pins every offloaded model's state
    dict, and an accelerate without the option is refused in one clear error."""
    import accelerate

    assert accelerate.__version__ == "1.15.0"  # the release the diffs are against
    shutil.copytree(Path(accelerate.__file__).parent, tmp_path / "accelerate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(diffusers_release("0.42.1") / "diffusers", tmp_path / "diffusers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    series = ["model_offload_keep_host.diff", "model_offload_pinned.diff", "sequential_offload_keep_cache.diff",
              "sequential_offload_pinned.diff", "model_offload_pinned_diffusers.diff",
              "sequential_offload_pinned_diffusers.diff"]
    for name in series:
        applied_diff = subprocess.run(["git", "apply", "-p2", str(PATCHES / name)], cwd=tmp_path,
                                      capture_output=True, text=True)
        assert applied_diff.returncode == 0, (name, applied_diff.stderr)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    run = subprocess.run([sys.executable, "-c", UPSTREAM_RUN], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["refused"].startswith("`enable_sequential_cpu_offload(pin_memory=True)` requires a version of")
    assert seen["loads"] > 0 and seen["pipeline's maps"] > 1  # the transformer and the VAE at least
    assert seen == {"accelerate": True, "diffusers": "0.42.1", "pinned at offload": True, "pinned in the calls": 0,
                    "loads": seen["loads"], "without a wait, cache kept": seen["loads"], "equal": True,
                    "refused": seen["refused"], "pipeline's maps": seen["pipeline's maps"],
                    "pipeline's maps pinned": True}

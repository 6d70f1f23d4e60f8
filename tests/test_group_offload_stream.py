"""`group_offload_top_level` on the CPU, where group offloading with a stream cannot run as such.

diffusers' group offloading with a stream needs an accelerator for exactly three things: the side stream, the
current stream (both only ordered and waited on) and pinned host memory. This test stands in for those three and
nothing else (a stream whose waits are counted, pinning as a plain copy, which is what pinning does to the values),
so that the rest, upstream's group offloading and the fix's rewritten code and runtime conversion, runs for real on
a tiny FLUX.1: outputs bit-identical, no blocking copy of the top-level group left, the fixed path counted as run,
and everything given back on exit. What the copies cost on a GPU is for `lab census` / `lab ab` there.
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import pytest
import torch

from lab.apply.fix import applied, exercised, get_fix
from lab.apply.patching import CallCounter, registered_hooks
from lab.run.scenario import build, get_scenario


class StandInStream:
    """An accelerator stream as group offloading uses it: waited on (counted) and made current."""

    waits = 0

    def synchronize(self) -> None:
        StandInStream.waits += 1

    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def stand_ins():
    current = StandInStream()
    with mock.patch.object(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu")), \
            mock.patch.object(torch.cpu, "current_stream", lambda *a, **k: current, create=True), \
            mock.patch.object(torch.cpu, "stream", lambda s: contextlib.nullcontext(), create=True), \
            mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone()), \
            mock.patch.object(torch.Tensor, "is_pinned", lambda self, *a, **k: False):
        yield


@contextlib.contextmanager
def blocking_copies(counts: list[str]):
    """Record every `.to(..., non_blocking=False)` that diffusers' group offloading makes (on a GPU, a blocking
    copy)."""
    tensor_to, module_to = torch.Tensor.to, torch.nn.Module.to

    def by_group_offloading() -> bool:
        return sys._getframe(2).f_code.co_filename.endswith("hooks/group_offloading.py")

    def watched_tensor_to(self, *args, **kwargs):
        if not kwargs.get("non_blocking", False) and by_group_offloading():
            counts.append("tensor")
        return tensor_to(self, *args, **kwargs)

    def watched_module_to(self, *args, **kwargs):
        if not kwargs.get("non_blocking", False) and by_group_offloading():
            counts.append("module")
        return module_to(self, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "to", watched_tensor_to), \
            mock.patch.object(torch.nn.Module, "to", watched_module_to):
        yield


def offload_with_a_stream(built) -> None:
    """Block-level group offloading of the denoiser on a (stand-in) stream, as `enable_group_offload(use_stream=True)`
    makes it, and a first call, which traces the order of the blocks for prefetching."""
    from diffusers.hooks import group_offloading as go

    with stand_ins():
        config = go.GroupOffloadingConfig(
            onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
            offload_type=go.GroupOffloadingType.BLOCK_LEVEL, non_blocking=True, record_stream=False,
            low_cpu_mem_usage=False, num_blocks_per_group=1, stream=StandInStream())
        go._apply_group_offloading(built.pipe.transformer, config)
        built()


@pytest.fixture(scope="module")
def streamed():
    """A tiny FLUX.1 with block-level group offloading on a (stand-in) stream, its reference output, and the
    top-level group."""
    from diffusers.hooks import group_offloading as go

    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    offload_with_a_stream(built)
    yield built, reference, built.pipe.transformer._diffusers_hook.get_hook(go._GROUP_OFFLOADING).group


def test_the_top_level_group_copies_without_blocking_and_gives_everything_back(streamed):
    from diffusers.hooks import group_offloading as go

    built, reference, top = streamed
    fix = get_fix("group_offload_top_level")
    before = dict(vars(top))
    tensors = len({id(t) for t in [*top.parameters, *top.buffers, *(p for m in top.modules for p in m.parameters())]})
    assert tensors > 0 and top.stream is None and top.non_blocking is False  # as upstream makes it

    unfixed: list[str] = []
    with stand_ins(), blocking_copies(unfixed):
        assert torch.equal(built().images, reference)
    assert unfixed.count("tensor") >= tensors  # every onload of the top-level group copies each of its tensors

    fixed: list[str] = []
    moved: list[int] = []  # each tensor the top-level group copies to the device
    transfer = go.ModuleGroup._transfer_tensor_to_device

    def counted(group, tensor, source, default_stream):
        if group is top:
            moved.append(id(tensor))
        return transfer(group, tensor, source, default_stream)

    counter = CallCounter()
    StandInStream.waits = 0
    with stand_ins(), applied([fix], built.pipe, counter):
        assert top.pinned_copies and top.non_blocking and len(top.cpu_param_dict) == tensors
        copies = dict(top.cpu_param_dict)
        # pointed at them, as the group's first offload would: none looks replaced by a cast, none is copied again
        assert all(t.data_ptr() == c.data_ptr() for t, c in copies.items() if t.device == c.device)
        with blocking_copies(fixed), mock.patch.object(go.ModuleGroup, "_transfer_tensor_to_device", counted):
            outputs = [built().images for _ in range(2)]
        # offloaded by pointing back at the copies
        assert all(p.data_ptr() == top.cpu_param_dict[p].data_ptr() for p in top.parameters)
        assert all(top.cpu_param_dict[t] is c for t, c in copies.items())
    # once per tensor and transformer call: upstream lists a submodule's tensors twice, and the copies would double
    assert len(moved) == tensors * 2 * built.steps and len(set(moved)) == tensors
    waits_fixed = StandInStream.waits
    assert all(torch.equal(out, reference) for out in outputs)
    assert fixed == []  # nothing left that waits for a copy
    assert exercised(fix, counter) == 2 * built.steps  # one onload of the top-level group per transformer call

    StandInStream.waits = 0
    with stand_ins():
        built(), built()
    assert waits_fixed == StandInStream.waits  # the block groups' stream waits are untouched: the fix adds none
    assert dict(vars(top)).keys() == before.keys() and top.non_blocking is False and top.cpu_param_dict == {}
    assert all(t.data_ptr() != c.data_ptr() for t, c in copies.items())  # on their own tensors again
    assert top.parameters is before["parameters"] and top.buffers is before["buffers"]
    assert "onload_" not in vars(top)


def test_without_a_stream_the_fix_changes_nothing_and_says_it_did_not_run():
    """No group of a configuration without a stream takes the pinned path: the exercised check reports 0."""
    from diffusers.hooks import group_offloading as go

    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    fix = get_fix("group_offload_top_level")
    with stand_ins():
        built.pipe.transformer.enable_group_offload(onload_device=torch.device("cpu"),
                                                    offload_device=torch.device("cpu"),
                                                    offload_type="block_level", num_blocks_per_group=1)
        counter = CallCounter()
        with applied([fix], built.pipe, counter):
            assert torch.equal(built().images, reference)
            groups = {id(h.group): h.group for _, h in registered_hooks(built.pipe, go.GroupOffloadingHook)}
            assert groups and not any(g.pinned_copies for g in groups.values())
        assert exercised(fix, counter) == 0
        assert not any("pinned_copies" in vars(g) for g in groups.values())

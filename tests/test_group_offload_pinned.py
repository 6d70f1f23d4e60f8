"""`group_offload_pinned` on the CPU, where group offloading moves nothing between devices and nothing can be pinned.

The stand-ins make the two moves real copies again (`two_devices`, as for `group_offload_keep_host`), give the
pinned blocks as plain buffers that `is_pinned` reports as pinned, and let the fix's rule pin a group that onloads
to the host (on a GPU it pins the groups that onload there). Upstream's group offloading and the fix's rewritten copy
and runtime part run for real on a tiny FLUX.1: outputs bit-identical, every onload of a weight a copy from a pinned
tensor without a wait, nothing copied back but buffers, the pinned space reused across the fix's turns, and
everything given back on exit. What it saves on a GPU is for `lab settings` and `lab ab` there.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from unittest import mock

import pytest
import torch

import fixes._offload as pinned_blocks
import fixes.group_offload_pinned as pinned_fix
from lab.apply.fix import applied, exercised, get_fix
from lab.apply.patching import CallCounter, offloading_groups
from lab.measure.settings_map import fixed_set
from lab.run.scenario import build, get_scenario
from tests.test_group_offload_keep_host import two_devices
from tests.test_group_offload_stream import stand_ins


@pytest.fixture
def pinned_stand_ins(monkeypatch):
    """Pinned blocks as plain buffers, reported as pinned (and nothing else), and a fresh cache of pinned copies."""
    given: list[torch.Tensor] = []

    def plain(nbytes: int) -> torch.Tensor:
        given.append(torch.empty(nbytes, dtype=torch.uint8))
        return given[-1]

    def is_pinned(self, *args, **kwargs):
        return any(b.data_ptr() <= self.data_ptr() < b.data_ptr() + b.numel() for b in given if self.numel())

    monkeypatch.setattr(pinned_blocks, "pinned_bytes", plain)
    monkeypatch.setattr(pinned_blocks, "BLOCK", 1 << 16)
    monkeypatch.setattr(pinned_blocks, "_blocks", [])
    monkeypatch.setattr(pinned_blocks, "_PINNED", {})
    return given, is_pinned


@contextlib.contextmanager
def onloads(seen: collections.Counter, is_pinned):
    """Count the copies `_transfer_tensor_to_device` makes, by whether their source is pinned and whether they wait."""
    to = torch.Tensor.to

    def watched(self, *args, **kwargs):
        if sys._getframe(1).f_code.co_name == "_transfer_tensor_to_device":
            source = "pinned" if is_pinned(self) else "pageable"
            seen[f"{source}, {'no wait' if kwargs.get('non_blocking') else 'blocking'}"] += 1
        return to(self, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "to", watched):
        yield


def offloaded(low_cpu_mem_usage: bool = False):
    """A tiny FLUX.1 under block-level group offloading without a stream, and its output without offloading."""
    from diffusers.hooks import group_offloading as go

    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    cpu = torch.device("cpu")
    with stand_ins():
        go._apply_group_offloading(built.pipe.transformer, go.GroupOffloadingConfig(
            onload_device=cpu, offload_device=cpu, offload_type=go.GroupOffloadingType.BLOCK_LEVEL,
            non_blocking=False, record_stream=False, low_cpu_mem_usage=low_cpu_mem_usage, num_blocks_per_group=1,
            stream=None))
    return built, reference


def test_the_weights_onload_from_pinned_tensors_without_a_wait_and_are_given_back(pinned_stand_ins, monkeypatch):
    given, is_pinned = pinned_stand_ins
    monkeypatch.setattr(pinned_fix, "pins", lambda group: not group.low_cpu_mem_usage)  # as for a GPU onload device
    built, reference = offloaded()
    fix = get_fix("group_offload_pinned")
    groups = [g for _, g in offloading_groups(built.pipe)]
    params = {id(p): p for g in groups for p in [*(p for m in g.modules for p in m.parameters()), *g.parameters]}
    buffers = {id(b) for g in groups for b in [*(b for m in g.modules for b in m.buffers()), *g.buffers]}
    pageable = {i: p.data for i, p in params.items()}

    unfixed: collections.Counter = collections.Counter()
    with stand_ins(), onloads(unfixed, is_pinned):
        assert torch.equal(built().images, reference)
    assert set(unfixed) == {"pageable, blocking"}  # upstream: every onload a blocking copy from pageable memory

    blocks = []
    for turn in range(2):
        moves, seen, counter = collections.Counter(), collections.Counter(), CallCounter()
        with mock.patch.object(torch.Tensor, "is_pinned", is_pinned), applied([fix], built.pipe, counter):
            kept = {id(p): t for g in groups for p, t in g.cpu_param_dict.items()}
            assert kept.keys() == params.keys() and all(is_pinned(t) for t in kept.values())
            with stand_ins(), mock.patch.object(torch.Tensor, "is_pinned", is_pinned), two_devices(moves), \
                    onloads(seen, is_pinned):
                outputs = [built().images for _ in range(2)]
            assert all(p.data_ptr() == kept[i].data_ptr() for i, p in params.items())  # pointed back at them
        assert all(torch.equal(out, reference) for out in outputs)
        transformer_calls = built.steps * 2  # FLUX.1 has no CFG: one transformer call per step, two calls
        assert seen["pinned, no wait"] == len(params) * transformer_calls  # every weight, without a wait
        assert seen["pinned, blocking"] == 0
        assert moves["back to the host"] == len(buffers) * transformer_calls  # only buffers are copied back
        assert exercised(fix, counter) == len(groups) * transformer_calls
        blocks.append(len(given))
        # given back: the very pageable tensors, nothing kept
        assert all(p.data is not None and p.data_ptr() == pageable[i].data_ptr() for i, p in params.items())
        assert all(g.cpu_param_dict == {} and "offload_" not in vars(g) for g in groups)
    assert blocks[1] == blocks[0]  # the second turn reuses the pinned space of the first

    # once its setting is undone (the settings map turns to the next), what it kept is let go; a later turn pins anew
    from lab.apply.fix import release
    release([fix])
    assert not pinned_blocks._PINNED and not pinned_blocks._blocks
    with mock.patch.object(torch.Tensor, "is_pinned", is_pinned), applied([fix], built.pipe):
        assert all(is_pinned(t) for g in groups for t in g.cpu_param_dict.values())
        with stand_ins(), mock.patch.object(torch.Tensor, "is_pinned", is_pinned):
            assert torch.equal(built().images, reference)
    assert len(given) == 2 * blocks[0]

    again: collections.Counter = collections.Counter()
    with stand_ins(), onloads(again, is_pinned):
        assert torch.equal(built().images, reference)
    assert set(again) == {"pageable, blocking"}


def test_with_low_cpu_mem_usage_nothing_is_pinned(pinned_stand_ins, monkeypatch):
    """The user's `low_cpu_mem_usage=True` keeps the block groups' host tensors as they are (pageable), as
    `group_offload_keep_host` does: nothing copied back, nothing of theirs pinned. The top-level group, which upstream
    makes without the user's option (`low_cpu_mem_usage=False`), pins its own."""
    given, is_pinned = pinned_stand_ins
    monkeypatch.setattr(pinned_fix, "pins", lambda group: not group.low_cpu_mem_usage)
    built, reference = offloaded(low_cpu_mem_usage=True)
    groups = [g for _, g in offloading_groups(built.pipe)]
    seen, counter = collections.Counter(), CallCounter()
    blocks = [g for g in groups if g.low_cpu_mem_usage]
    assert blocks and len(groups) - len(blocks) == 1  # the top-level group, made with `low_cpu_mem_usage=False`
    with applied([get_fix("group_offload_pinned")], built.pipe, counter):
        assert all(t.data_ptr() == p.data_ptr() for g in blocks for p, t in g.cpu_param_dict.items())
        assert not any(is_pinned(t) for g in blocks for t in g.cpu_param_dict.values())
        with stand_ins(), mock.patch.object(torch.Tensor, "is_pinned", is_pinned), onloads(seen, is_pinned):
            assert torch.equal(built().images, reference)
    block_params = sum(1 for g in blocks for m in g.modules for _ in m.parameters())
    assert seen["pageable, blocking"] == block_params * built.steps and seen["pinned, no wait"] > 0
    assert "pinned, blocking" not in seen
    assert exercised(get_fix("group_offload_pinned"), counter) == len(groups) * built.steps


def test_on_the_host_the_rule_pins_nothing():
    """The rule of the rewritten `_init_cpu_param_dict`: a group that onloads to the host has nothing to pin (and a
    CPU build of torch cannot pin)."""
    from types import SimpleNamespace

    assert not pinned_fix.pins(SimpleNamespace(low_cpu_mem_usage=False, onload_device=torch.device("cpu")))
    assert not pinned_fix.pins(SimpleNamespace(low_cpu_mem_usage=True, onload_device=torch.device("cuda")))
    assert pinned_fix.pins(SimpleNamespace(low_cpu_mem_usage=False, onload_device="cuda:0"))


def test_the_settings_map_takes_it_in_place_of_group_offload_keep_host():
    """It includes `group_offload_keep_host` (they conflict): the map's fixed arm without a stream runs this one."""
    names = {f.name for f in fixed_set("flux", ["group_offload (level=block_level, blocks=1, stream=False, "
                                                "record_stream=False)"])}
    assert "group_offload_pinned" in names and "group_offload_keep_host" not in names

"""Sequential CPU offload loads each weight from pinned host memory, without a wait.

`enable_sequential_cpu_offload` gives every leaf module accelerate's `AlignDevicesHook`, which keeps the module's
weights on the `meta` device and, in each forward, copies them in from a host state dict (its `weights_map`) with
`set_module_tensor_to_device`: one blocking copy per weight from pageable memory, in every forward of every leaf
module, nearly every sync of an offloaded call. After the forward it points them back at `meta`, so nothing is copied
back and the host tensors never change. Found by the lab after `model_offload_pinned`.

The runtime patch copies each host tensor of those state dicts once into pinned memory (in blocks, as
`model_offload_pinned`: `fixes/_offload.py`), when the fix is switched on, before the call an A/B times (upstream
would pin once, at `enable_sequential_cpu_offload`), and makes `set_module_tensor_to_device` copy from a pinned tensor
with `non_blocking=True`: the host goes on to queue the forward while the copy runs before it in stream order, and
the copy runs at the link's speed. Outputs are bit-identical (the same values). A cast after offloading
(`model.to(torch.bfloat16)`) casts the parameters on `meta`, and each load casts the pinned host value to their dtype,
as upstream does with its pageable one. The state dicts get their pageable tensors back when the fix is switched off;
the pinned copies are kept for its next turn (the tensors of a state dict never change: a changed one is copied
again, into the same pinned space). Costs page-locked host memory for every offloaded weight, as
`model_offload_pinned`; in the lab the pageable tensors are kept too.

`AlignDevicesHook.pre_forward` and `set_module_tensor_to_device` are accelerate's (1.15.0, `accelerate/hooks.py`,
`accelerate/utils/modeling.py`). Each load still ends in `torch.cuda.empty_cache()` upstream, which waits for the
device (`cudaFree`): `sequential_offload_keep_cache` takes that away, so the two are timed alone and together. On the
CPU, `tests/test_sequential_offload_pinned.py` runs it under accelerate's sequential offload with stand-ins for the
pinned memory, and applies its upstream diffs: `patches/accelerate/sequential_offload_pinned.diff` (accelerate, with
`cpu_offload(pin_memory=True)`) and `sequential_offload_pinned_diffusers.diff` (diffusers'
`enable_sequential_cpu_offload(pin_memory=True)`).
"""

from fixes._offload import pass_to_loads, pinned_copy, release_pinned
from lab.apply import EVERY, Fix, Upstream

EXERCISED = "set_module_tensor_to_device (a weight from its pinned copy, without a wait)"

#: (id(state dict), key) -> (the pageable tensor, its version, its pinned copy): kept across the fix's turns
_PINNED: dict = {}


def weights_maps(pipe) -> list[dict]:
    """The host state dicts that accelerate's sequential offload loads the pipeline's weights from: its
    `AlignDevicesHook`s' `weights_map`, a `PrefixedDataset` over one dict per model."""
    import torch
    from accelerate.hooks import AlignDevicesHook

    found: dict[int, dict] = {}
    for model in pipe.components.values():
        if not isinstance(model, torch.nn.Module):
            continue
        for module in model.modules():
            hook = getattr(module, "_hf_hook", None)
            for h in getattr(hook, "hooks", None) or [hook]:  # accelerate chains hooks as a `SequentialHook`
                if isinstance(h, AlignDevicesHook) and h.offload and h.weights_map is not None:
                    state = getattr(h.weights_map, "dataset", h.weights_map)
                    if isinstance(state, dict):
                        found[id(state)] = state
    return list(found.values())


def _pin(state: dict, key: str, swapped: list) -> None:
    """Put the pinned copy of `state[key]` in its place (copied once; again where the tensor or its version changed),
    remembering the pageable tensor for the fix's exit. A tensor that is not a plain, contiguous host tensor stays."""
    import torch

    tensor = state[key]
    if type(tensor) is not torch.Tensor or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return
    known = _PINNED.get((id(state), key))
    if known is None or known[2].shape != tensor.shape or known[2].dtype != tensor.dtype:
        known = (tensor, tensor._version, pinned_copy(tensor))
    elif known[0] is not tensor or known[1] != tensor._version:
        known[2].copy_(tensor)  # into the pinned space it had
        known = (tensor, tensor._version, known[2])
    _PINNED[(id(state), key)] = known
    swapped.append((state, key, tensor))
    state[key] = known[2]


def release() -> None:
    """Let go of the pinned copies kept across the fix's turns, and of their blocks."""
    _PINNED.clear()
    release_pinned()


def runtime(pipe, patcher) -> None:
    """`set_module_tensor_to_device` copies a pinned weight without a wait; the offload state dicts hold pinned
    copies while the fix is on."""
    import torch

    swapped: list = []  # (state dict, key, the pageable tensor it held before this turn of the fix)

    def from_pinned(device, value) -> bool:
        return isinstance(value, torch.Tensor) and str(device) != "meta" and value.is_pinned()

    def give_back() -> None:  # the state dicts as they were: each key on its pageable tensor again
        for state, key, pageable in reversed(swapped):
            state[key] = pageable
        swapped.clear()

    pass_to_loads(patcher, EXERCISED, from_pinned, non_blocking=True)
    patcher.on_restore(give_back)
    states = weights_maps(pipe)
    live = {id(state) for state in states}
    for key in [k for k in _PINNED if k[0] not in live]:
        del _PINNED[key]  # the copies of state dicts that are gone (another pipeline's, an earlier offload's)
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # no copy still reads a pinned tensor that pinning writes again
    for state in states:  # upstream would pin once, at `enable_sequential_cpu_offload`: before the call
        for key in list(state):
            _pin(state, key, swapped)


FIX = Fix(
    name="sequential_offload_pinned",
    description="Sequential CPU offload keeps the offloaded host weights in pinned memory and copies each one to the "
                "device without a wait.",
    upstream=Upstream(refs=(), note="found by the lab; the copies are accelerate's `AlignDevicesHook` (accelerate "
                                    "1.15), so the change belongs there: patches/accelerate/ (after "
                                    "sequential_offload_keep_cache's), and diffusers passes the option on",
                      overlaps=()),
    pipelines=EVERY,
    setting="sequential_cpu_offload",
    runtime=runtime,
    runtime_targets=("accelerate.hooks.set_module_tensor_to_device (as AlignDevicesHook.pre_forward calls it)",),
    exercised_by=(EXERCISED,),
    tried_on="flux",
    release=release,
)

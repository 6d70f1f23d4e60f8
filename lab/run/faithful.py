"""Models with random weights, made as `from_pretrained` followed by `.to(device)` makes them from a checkpoint
(`faithful_model`): the same dtypes, the same tensors on the host and on the device, without the checkpoint and
without a copy of the weights on the host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from lab.run.dtypes import checkpoint_dtype


@contextlib.contextmanager
def default_dtype_and_device(dtype: torch.dtype, device: str) -> Iterator[None]:
    """Create parameters directly on `device` in `dtype` (no fp32 detour that doubles memory)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def faithful_model(cls: type, config: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A model with random weights, as `cls.from_pretrained(checkpoint, torch_dtype=dtype)` followed by
    `.to(device)` gives it, without its checkpoint and without a copy of the weights on the host.

    What `from_pretrained` does (diffusers 0.37.1, `ModelMixin.from_pretrained` and `load_model_dict_into_meta`):
    it constructs the model with `dtype` as torch's default dtype and the parameters on the meta device
    (`accelerate.init_empty_weights()`, buffers included: no), so buffers and tensors kept as plain attributes are
    made on the host by `__init__`; it then loads every state-dict entry (parameters and persistent buffers) in
    `dtype`, or in float32 for a name that `_keep_in_fp32_modules` matches (by dotted part), floating point only;
    non-persistent buffers keep what `__init__` made. The user's `.to(device)` moves parameters and buffers, not
    plain attributes: a plain tensor stays on the host (Qwen-Image's rope frequencies are copied to the device in
    every forward because of it).

    Here: the parameters are made where they will live, on `device` in `dtype` (the module's own init runs there,
    as before: no host copy, no float32 detour of the model). A skeleton of the same config is constructed as
    `from_pretrained` constructs it (meta parameters, host buffers and plain tensors, `dtype` the default), and its
    non-persistent buffers and plain tensors replace the device model's, so that they are the host tensors
    `__init__` makes. Persistent buffers and parameters get the dtype loading gives them. The caller's
    `pipe.to(device)` then moves what a user's moves.
    """
    import accelerate

    with default_dtype_and_device(dtype, device), _defined_empty():
        model = cls(**config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with accelerate.init_empty_weights(include_buffers=False):
            skeleton = cls(**config)
    finally:
        torch.set_default_dtype(previous)

    def loaded_dtype(name: str, tensor: torch.Tensor) -> torch.dtype:
        return checkpoint_dtype(cls, name, tensor, dtype)

    skeleton_modules = dict(skeleton.named_modules())
    for prefix, module in model.named_modules():
        twin = skeleton_modules[prefix]
        for name, param in list(module._parameters.items()):
            if param is not None:
                wanted = loaded_dtype(f"{prefix}.{name}" if prefix else name, param)
                if param.dtype != wanted:
                    module._parameters[name] = torch.nn.Parameter(param.detach().to(wanted),
                                                                  requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if name in module._non_persistent_buffers_set:  # not in a checkpoint: what `__init__` made, on the host
                module._buffers[name] = twin._buffers[name]
            else:  # loaded from the checkpoint: its values, in the dtype loading gives
                module._buffers[name] = buffer.to(loaded_dtype(f"{prefix}.{name}" if prefix else name, buffer))
        for name, value in list(vars(module).items()):
            if name.startswith("_"):
                continue
            if isinstance(value, torch.Tensor) or _holds_tensors(value):
                object.__setattr__(module, name, vars(twin)[name])
    del skeleton
    return model.eval()


@contextlib.contextmanager
def _defined_empty() -> Iterator[None]:
    """`torch.empty` as `torch.zeros` while a model is constructed: a parameter that `__init__` leaves as made
    (Z-Image's pad tokens, which only the checkpoint fills) holds zeros, the same on every build, instead of whatever
    the memory held (a NaN there would reach the output). Initialised parameters are overwritten by their init as
    before."""
    empty = torch.empty

    def zeros(*args, **kwargs):  # the real `torch.empty`, then filled (torch.zeros may itself call torch.empty)
        tensor = empty(*args, **kwargs)
        return tensor if tensor.is_meta or "out" in kwargs else tensor.zero_()

    torch.empty = zeros
    try:
        yield
    finally:
        torch.empty = empty


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, torch.Tensor) for v in value.values())
    return False

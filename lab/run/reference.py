"""The reference a numerics check holds both arms against: the same pipeline, weights and inputs, in higher
precision (`lab.verdicts.numerics`).

The weights are not rebuilt: every floating parameter and buffer of the pipeline's models is upcast in place for
one call and given back its own tensor afterwards (the same storage, so nothing that holds it notices, and an error
half-way gives it back too). The prompt embeddings are upcast for that call. The noise is the arms' own: the
`randn_tensor` calls of the control's verifying call are recorded and replayed, cast, in the reference call, so that
the reference starts from exactly the arms' latents rather than from a draw at another precision. Compiled code runs
eagerly, and TF32 is off, so the reference's matmuls round at its own precision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
from collections.abc import Iterator
from typing import Any

import torch

from lab.apply.patching import Patcher
from lab.run.scenario import Built


def reference_dtype(built: Built) -> torch.dtype:
    """float32 where the arms run bf16 or fp16 on a GPU; float64 otherwise (a float32 arm, or any CPU run)."""
    if built.device.startswith("cuda") and built.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return torch.float64


def _randn_owners() -> list[Any]:
    """Every diffusers module that holds `randn_tensor` (pipelines import it by name)."""
    from diffusers.utils import torch_utils

    original = torch_utils.randn_tensor
    return [m for name, m in list(sys.modules.items())
            if name.startswith("diffusers") and m is not None and getattr(m, "randn_tensor", None) is original]


@contextlib.contextmanager
def recorded_noise(tape: list[torch.Tensor]) -> Iterator[None]:
    """Record every `randn_tensor` result of the call inside into `tape`."""
    from diffusers.utils import torch_utils

    original = torch_utils.randn_tensor

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        tape.append(out.detach().clone())
        return out

    with Patcher() as patcher:
        for module in _randn_owners():
            patcher.setattr(module, "randn_tensor", recording)
        yield


@contextlib.contextmanager
def replayed_noise(tape: list[torch.Tensor], used: list[int]) -> Iterator[None]:
    """`randn_tensor` answers from `tape` in order, cast to the dtype and device asked for (a fresh draw once the
    tape is spent; `used[0]` counts the replayed ones)."""
    from diffusers.utils import torch_utils

    original = torch_utils.randn_tensor

    def replaying(shape, generator=None, device=None, dtype=None, layout=None, **kwargs):
        i = used[0]
        if i < len(tape) and tuple(tape[i].shape) == tuple(shape):
            used[0] += 1
            return tape[i].to(device=device or tape[i].device, dtype=dtype or tape[i].dtype)
        return original(shape, generator=generator, device=device, dtype=dtype, layout=layout, **kwargs)

    with Patcher() as patcher:
        for module in _randn_owners():
            patcher.setattr(module, "randn_tensor", replaying)
        yield


@contextlib.contextmanager
def upcast(built: Built, dtype: torch.dtype) -> Iterator[Built]:
    """The pipeline with its models' floating tensors and its prompt embeddings in `dtype`, for the calls inside;
    each tensor gets its own storage back after, exactly."""
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    try:
        for component in built.pipe.components.values():
            if not isinstance(component, torch.nn.Module):
                continue
            for t in itertools.chain(component.parameters(), component.buffers()):
                if id(t) in seen or not t.is_floating_point() or t.dtype == dtype:
                    continue
                seen.add(id(t))
                swapped.append((t, t.data))
                t.data = t.data.to(dtype)
        prompt = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                  for k, v in built.prompt_kwargs.items()}
        precision = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            yield dataclasses.replace(built, prompt_kwargs=prompt)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = precision
    finally:
        for t, data in reversed(swapped):
            t.data = data


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """‖out − reference‖ / ‖reference‖ in float64 (NaN where either holds NaN; inf for a zero reference)."""
    a, r = out.detach().to("cpu", torch.float64), reference.detach().to("cpu", torch.float64)
    norm = float(r.norm())
    diff = float((a - r).norm())
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / norm

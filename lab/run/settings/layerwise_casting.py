"""Layerwise casting (`transformer.enable_layerwise_casting(storage_dtype, compute_dtype)`): the transformer's weights
stored in float8 and cast to the compute dtype layer by layer."""

from __future__ import annotations

from typing import Any

from lab.run.settings.hooks import hook_snapshot, restore_hooks
from lab.run.settings.kind import Kind, Target, Undo


def _layerwise_casting(built: Any, options: dict) -> Undo:
    """Transformer weights stored in float8 (e4m3fn by default) and cast to the compute dtype per layer. The cast
    loses precision, so the undo puts back a copy of the weights taken before."""
    import torch

    transformer = getattr(built.pipe, built.scenario.denoiser)
    # on the host: a copy on the device would hold the memory that float8 storage is meant to free
    saved = {k: v.detach().to("cpu", copy=True) for k, v in transformer.state_dict().items()}
    hooks = hook_snapshot(transformer)
    transformer.enable_layerwise_casting(storage_dtype=getattr(torch, options["storage"]), compute_dtype=built.dtype)

    def undo() -> None:
        # diffusers cannot remove this hook (`LayerwiseCastingHook does not support deinitialization`): the modules'
        # forwards and hook registries go back to what they were, and the weights to the copy
        restore_hooks(hooks)
        with torch.no_grad():
            for k, v in transformer.state_dict(keep_vars=True).items():
                original = saved[k]
                v.data = original.to(v.device)

    return undo


def _storage_check(target: Target, options: dict) -> str | None:
    import torch

    if not hasattr(torch, options["storage"]):
        return f"this torch has no dtype `{options['storage']}`"
    return None


KINDS = (
    Kind("layerwise_casting", "transformer weights stored in float8, cast to the compute dtype layer by layer",
         "transformer.enable_layerwise_casting(storage_dtype, compute_dtype)",
         options={"storage": "float8_e4m3fn"}, choices={"storage": ("float8_e4m3fn", "float8_e5m2")},
         check=_storage_check, apply=_layerwise_casting),
)

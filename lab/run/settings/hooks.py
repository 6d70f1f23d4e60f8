"""Diffusers' hook registries on a model's modules: counted, and saved to put back exactly as they were where
diffusers cannot remove a hook itself."""

from __future__ import annotations

from typing import Any


def hook_snapshot(model: Any) -> list[tuple[Any, Any, Any, tuple]]:
    """Each module's own `forward` attribute and diffusers hook registry (with its hooks, in order), to put back."""
    out = []
    for module in model.modules():
        registry = module.__dict__.get("_diffusers_hook")
        state = (dict(registry.hooks), list(registry._hook_order), list(registry._fn_refs)) if registry else ()
        out.append((module, module.__dict__.get("forward"), registry, state))
    return out


def restore_hooks(snapshot: list[tuple[Any, Any, Any, tuple]]) -> None:
    for module, forward, registry, state in snapshot:
        for attr, value in (("forward", forward), ("_diffusers_hook", registry)):
            if value is None:
                module.__dict__.pop(attr, None)
            else:
                module.__dict__[attr] = value
        if registry is not None:
            registry.hooks, registry._hook_order, registry._fn_refs = dict(state[0]), list(state[1]), list(state[2])


def hook_count(model: Any) -> int:
    """How many diffusers hooks are registered on the modules of `model`."""
    return sum(len(m.__dict__["_diffusers_hook"].hooks) for m in model.modules() if "_diffusers_hook" in m.__dict__)

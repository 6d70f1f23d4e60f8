"""The attention backend (`transformer.set_attention_backend(name)`): attention through another kernel, refused where
diffusers lacks it, this host lacks what it needs, or the transformer gives its attention a mask it does not take."""

from __future__ import annotations

from typing import Any

from lab.run.settings.kind import Kind, Target, Undo


def _attention_check(target: Target, options: dict) -> str | None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    try:
        backend = AttentionBackendName(options["backend"])
    except ValueError:
        return (f"diffusers has no attention backend `{options['backend']}` "
                f"(it has {', '.join(b.value for b in AttentionBackendName)})")
    try:
        _check_attention_backend_requirements(backend)
    except (RuntimeError, ImportError, ValueError) as e:
        return str(e).splitlines()[0].rstrip(".")
    refusal = masks_refused(backend)
    if refusal and target.attention_mask is not None and target.attention_mask():
        return (f"its transformer's attention is given a mask, which the `{backend.value}` backend does not take "
                f"(diffusers raises \"{refusal}\" at the first attention call)")
    return None


def masks_refused(backend: Any) -> str | None:
    """diffusers' own error when the attention `backend` is given a mask, read off its registered function's source
    (`if attn_mask is not None: raise ValueError(...)`); None when it takes one, or when the source cannot say."""
    import ast
    import inspect
    import re

    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    try:
        source = inspect.getsource(_AttentionBackendRegistry._backends[backend])
    except (KeyError, OSError, TypeError):
        return None
    found = re.search(r"if attn_mask is not None:\s*raise ValueError\((?P<message>\"[^\"\n]*\")\)", source)
    return ast.literal_eval(found["message"]) if found else None


def _attention_apply(built: Any, options: dict) -> Undo:
    denoiser = getattr(built.pipe, built.scenario.denoiser)
    denoiser.set_attention_backend(options["backend"])
    return denoiser.reset_attention_backend


KINDS = (
    Kind("attention_backend", "attention through another kernel (native SDPA, flash, cuDNN, flex, sage, ...)",
         "transformer.set_attention_backend(name)", options={"backend": "native"},
         check=_attention_check, apply=_attention_apply, positional="backend"),
)

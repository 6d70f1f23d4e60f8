"""The dtype `from_pretrained(torch_dtype=...)` loads each state-dict entry in: what the faithful build gives a model's
tensors (`lab.run.scenario`) and what a quantized load changes (`lab.run.settings`)."""

from __future__ import annotations

import torch


def checkpoint_dtype(cls: type, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype `from_pretrained(torch_dtype=dtype)` loads a state-dict entry in: float32 for a floating-point entry
    whose dotted name has a part in `cls._keep_in_fp32_modules`, `dtype` for the other floating-point ones, and its
    own dtype for the rest (`load_model_dict_into_meta`)."""
    if not torch.is_floating_point(tensor):
        return tensor.dtype
    keep = getattr(cls, "_keep_in_fp32_modules", None) or []
    keep = [keep] if isinstance(keep, str) else keep
    return torch.float32 if any(k in name.split(".") for k in keep) else dtype

"""How large a scenario is before it is built: its parameters, counted on models made on the meta device, and a rough
peak of its memory against what the device has free (`lab scenarios`, and the check before a build)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from lab.run.definition import Scenario, model_dtype, resolve
from lab.run.dtypes import checkpoint_dtype


@dataclasses.dataclass(frozen=True)
class Estimate:
    params: dict[str, int]
    weight_bytes: int
    activation_bytes: int

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def peak_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes


def estimate(scenario: Scenario, size: str, layers: int | None, dtype: torch.dtype) -> Estimate:
    """Parameter counts (from models built on the meta device) and a rough peak-memory estimate.

    Activations are estimated as 24 bytes per latent token per hidden unit of the transformer (attention and MLP
    working set of one block at a time); a coarse figure, stated as an estimate wherever it is shown.
    """
    params, weight_bytes = {}, 0
    for name, model in scenario.models.items():
        cls = resolve(model.cls)
        with torch.device("meta"), _no_weight_init():
            module = cls(**scenario.config(name, size, layers))
        named = dict(module.named_parameters())
        params[name] = sum(p.numel() for p in named.values())
        # in the dtypes loading gives them (`_keep_in_fp32_modules` at 4 bytes)
        weight_bytes += sum(p.numel() * checkpoint_dtype(type(module), n, p, model_dtype(model, dtype)).itemsize
                            for n, p in named.items())
    tokens = latent_tokens(scenario, size)
    hidden = _hidden_size(scenario.config(scenario.denoiser, size, layers))
    return Estimate(params, weight_bytes, 24 * tokens * hidden * max(1, scenario.call.get("_cfg_batch", 2)))


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """`torch.nn.init`'s in-place initializers as no-ops, for models built on the meta device only to be counted: there
    they write nothing, but each call still goes through the device mode's dispatch, a large share of `lab
    scenarios`' estimates. Restored on exit, exceptions included."""
    names = [n for n in vars(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, _unchanged)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def _unchanged(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def _hidden_size(config: dict[str, Any]) -> int:
    """The denoiser's width: heads x head size for a transformer, the widest stage for a UNet (its `attention_head_dim`
    is then a list per stage, or absent)."""
    if "block_out_channels" in config or isinstance(config.get("attention_head_dim"), (list, tuple)):
        return int(max(config.get("block_out_channels") or [1280]))
    return int(config.get("num_attention_heads", 24)) * int(config.get("attention_head_dim", 128))


def latent_tokens(scenario: Scenario, size: str) -> int:
    call = scenario.call_for(size)
    h, w = call.get("height", 1024), call.get("width", 1024)
    frames = call.get("num_frames")
    tokens = (h // 16) * (w // 16)
    if frames:
        tokens *= (frames - 1) // 4 + 1
    return tokens


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"

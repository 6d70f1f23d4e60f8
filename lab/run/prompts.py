"""Stand-ins for what a scenario's text encoders and image inputs give the pipeline: random prompt embeddings of the
true shapes, tokenizer masks, and random input images, all drawn on the CPU from the call's generator so that any
device gets the same values."""

from __future__ import annotations

import torch


def text_embeds(batch: int, seq: int, dim: int, generator, device, dtype, *, negative: bool,
                scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Random stand-ins for a text encoder's output: `prompt_embeds` (and `negative_prompt_embeds`) [B, seq, dim]."""
    out = {"prompt_embeds": randn((batch, seq, dim), generator, device, dtype, scale)}
    if negative:
        out["negative_prompt_embeds"] = randn((batch, seq, dim), generator, device, dtype, scale)
    return out


def token_mask(batch: int, seq: int, tokens: int, device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A tokenizer's attention mask for a prompt of `tokens` tokens padded on the right to `seq`: 1 then 0,
    [B, seq]."""
    return (torch.arange(seq) < min(tokens, seq)).to(dtype).expand(batch, seq).to(device)


def random_images(height: int, width: int, count: int, generator) -> list:
    """Random RGB PIL images (input frames for image- and video-conditioned pipelines), seeded by `generator`."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(int(generator.initial_seed()) % 2**32)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def randn(shape, generator, device, dtype, scale: float = 1.0) -> torch.Tensor:
    """Random prompt embeddings: drawn on the CPU from `generator` (reproducible on any device), then moved."""
    return (torch.randn(shape, generator=generator) * scale).to(device=device, dtype=dtype)

"""Writes a matplotlib figure as the pages' PNG: rendered at one resolution, stored with a palette of 256 colours.

The plots are flat colours, lines and text, so a palette keeps them as they look and stores them in about a third
of the bytes of matplotlib's full-colour PNG (372 committed plots: 22.8 MB -> 8.3 MB, 2026-11-27). That matters
beyond the repository's weight: the tree that travels to a lent GPU host may hold 64 MiB in all
(`campaigns/device.sh`), and the plots were most of `results/`.
"""

from __future__ import annotations

import io
from pathlib import Path

from lab.base import files

DPI = 110


def palette_png(png: bytes) -> bytes:
    """A PNG's pixels as an 8-bit palette PNG (median cut, no dithering: the plots' flat colours stay flat)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        quantized = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                                  dither=Image.Dither.NONE)
    out = io.BytesIO()
    quantized.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save(fig, path: Path | str, *, tight: bool = False) -> Path:
    """`fig` as a palette PNG at `path` (whole or not at all), and closed. `tight`: the canvas grows or shrinks to
    what it draws (`bbox_inches="tight"`), for figures whose long labels would otherwise be cut."""
    import matplotlib.pyplot as plt

    rendered = io.BytesIO()
    try:
        fig.savefig(rendered, format="png", dpi=DPI, **({"bbox_inches": "tight"} if tight else {}))
    finally:
        plt.close(fig)
    return files.write_bytes(path, palette_png(rendered.getvalue()))

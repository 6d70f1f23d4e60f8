"""Writes a matplotlib figure as the pages' PNG: rendered at one resolution, stored with a palette of 256 colours.

The plots are flat colours, lines and text, so a palette keeps them as they look and stores them in about a third
of the bytes of matplotlib's full-colour PNG. That matters
beyond the repository's weight: the tree that travels to a lent GPU host may hold at most 64 MiB in all
(`campaigns/device.sh`), and the plots are most of `results/`.

A plot drawn from many results (`lab table`'s) is drawn again only when what it shows changed: `key` hashes what
draws it (the source of its functions, this module's, the plotting libraries' versions) and what it draws (the
values), `save` writes that key beside the PNG (`<name>.png.key`, with the PNG's own hash), and `current` says
whether the PNG there is the one that key draws. Drawing is most of `lab table`'s time; reading a key is nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import io
import json
from importlib import metadata
from pathlib import Path
from typing import Any

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


def save(fig, path: Path | str, *, tight: bool = False, key: str | None = None) -> Path:
    """`fig` as a palette PNG at `path` (whole or not at all), and closed. `tight`: the canvas grows or shrinks to
    what it draws (`bbox_inches="tight"`), for figures whose long labels would otherwise be cut. `key` (`key`): what
    drew it, written beside it for `current`."""
    import matplotlib.pyplot as plt

    rendered = io.BytesIO()
    try:
        fig.savefig(rendered, format="png", dpi=DPI, **({"bbox_inches": "tight"} if tight else {}))
    finally:
        plt.close(fig)
    png = palette_png(rendered.getvalue())
    written = files.write_bytes(path, png)
    if key is not None:
        files.write_text(key_path(written), f"{key} {hashlib.sha256(png).hexdigest()}\n")
    return written


def key_path(path: Path | str) -> Path:
    """Where the key of the plot at `path` is kept: beside it, `<name>.png.key`."""
    return Path(path).with_name(Path(path).name + ".key")


def key(*parts: Any) -> str:
    """The key of a plot: a hash of the source of each function or module among `parts` and of this module, of the
    versions of matplotlib, Pillow and numpy, and of every other part (what is drawn) as canonical JSON. Two calls
    give one key exactly when they would draw the same picture."""
    digest = hashlib.sha256()
    for part in (*_drawing(), *parts):
        text = inspect.getsource(part) if inspect.ismodule(part) or inspect.isfunction(part) else \
            json.dumps(_canonical(part), sort_keys=True, ensure_ascii=False)
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()


def current(path: Path | str, plot_key: str) -> bool:
    """Whether the PNG at `path` is the one `plot_key` draws: its key beside it is that key and names these bytes."""
    try:
        kept = key_path(path).read_text().split()
        png = Path(path).read_bytes()
    except OSError:
        return False
    return kept == [plot_key, hashlib.sha256(png).hexdigest()]


def _drawing() -> tuple:
    """What every plot's key holds: this module (the resolution, the palette) and the libraries that draw."""
    versions = {name: _version(name) for name in ("matplotlib", "pillow", "numpy")}
    return inspect.getmodule(_drawing), versions


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _canonical(value: Any) -> Any:
    """`value` as plain JSON that tells apart every two values a plot could draw differently (floats by their exact
    repr, an enum by its class and value); a type it does not know is an error, never a silent str()."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _canonical({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, enum.Enum):
        return [type(value).__name__, _canonical(value.value)]
    if isinstance(value, dict):
        return [[_canonical(k), _canonical(v)] for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, float):
        return repr(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Path):
        return value.as_posix()
    if hasattr(value, "tolist"):  # a numpy array or scalar
        return _canonical(value.tolist())
    raise TypeError(f"cannot key a plot on a {type(value).__name__}")

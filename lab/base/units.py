"""Times as people write them: `90s`, `10m`, `1.5h` in, `40 s`, `7 min`, `2.5 h` out."""

from __future__ import annotations

UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """`90s`, `10m`, `1.5h` or plain seconds -> seconds; ValueError for anything else."""
    text = str(text).strip()
    value, unit = (text[:-1], text[-1]) if text and text[-1] in UNITS else (text, "s")
    try:
        seconds = float(value) * UNITS[unit]
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"`{text}`: expected a positive time such as 90s, 10m or 1.5h")
    return seconds


def duration(seconds: float) -> str:
    """`40 s`, `7 min`, `2.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

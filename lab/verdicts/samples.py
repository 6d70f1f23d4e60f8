"""Plain summaries of a sample (median, MAD, coefficient of variation) and the paired blocks' ratios: pure
functions over sequences of numbers (no torch, no IO).

The design is paired: every block runs both arms, so the unit of evidence is the per-block log ratio
d = log(test / control), which every interval and check of `lab.verdicts` reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation (unscaled)."""
    v = np.asarray(values, dtype=float)
    return float(np.median(np.abs(v - np.median(v))))


def cv(values: Sequence[float]) -> float:
    """Standard deviation over median (robust centre, as in pyperf's check)."""
    v = np.asarray(values, dtype=float)
    return float(np.std(v, ddof=1) / np.median(v)) if len(v) > 1 else 0.0


def paired_ratios(control: Sequence[float], test: Sequence[float]) -> list[float]:
    """Per-block ratio test/control. Raises ValueError for unequal lengths or non-positive times."""
    if len(control) != len(test):
        raise ValueError(f"paired samples need equal lengths (control {len(control)}, test {len(test)})")
    if any(x <= 0 for x in control) or any(x <= 0 for x in test):
        raise ValueError("times must be > 0")
    return [t / c for c, t in zip(control, test)]


def log_ratios(control: Sequence[float], test: Sequence[float]) -> list[float]:
    return [math.log(r) for r in paired_ratios(control, test)]

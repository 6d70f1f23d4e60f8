"""Strided inputs: a matmul, linear, normalisation or attention fed a layout that costs a copy (`needs_copy`), with
the Python line that called it. Such an input costs a layout copy inside the operator or a slower kernel in every
call that sees it; the usual cause is an activation left transposed by a patch embedding
(`flatten(2).transpose(1, 2)`) before a loop of blocks."""

from __future__ import annotations

import re

import numpy as np

from lab.traces.arithmetic import ELEMENT_BYTES
from lab.traces.operators import Ops, site
from lab.traces.timeline import Frames


def _contiguous(sizes: list[int], strides: list[int]) -> bool:
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _as_rows(sizes: list[int], strides: list[int]) -> bool:
    """Whether a matmul operand can be read as a matrix without a copy: its leading dimensions merge into one (a
    view as (-1, last)) and one of the matrix's two strides is 1 (a transposed matrix is read as it is)."""
    kept = [(n, st) for n, st in zip(sizes[:-1], strides[:-1]) if n != 1]
    for (_, outer), (inner_n, inner) in zip(kept, kept[1:]):
        if outer != inner * inner_n:
            return False
    row = kept[-1][1] if kept else 0
    return strides[-1] == 1 or sizes[-1] == 1 or row == 1


#: operators whose tensor inputs are looked at for layouts that cost a copy, and the rule for each: a matmul's
#: operands must read as matrices (`_as_rows`; a linear's weight is laid out by the model), a normalisation's input
#: must be contiguous, an attention's inputs need a contiguous last dimension (their other strides are read as
#: they are). The outermost such operator is looked at: its children see what it made of the input.
_STRIDE_RULES = (
    (re.compile(r"^aten::linear$"), lambda arg, d, s: arg == 0 and not _as_rows(d, s)),
    (re.compile(r"^aten::(?:matmul|mm|addmm|bmm|baddbmm)$"), lambda arg, d, s: not _as_rows(d, s)),
    (re.compile(r"^aten::(?:layer_norm|group_norm|rms_norm)$"), lambda arg, d, s: arg == 0 and not _contiguous(d, s)),
    (re.compile(r"^aten::(?:scaled_dot_product_attention|_scaled_dot_product_\w+_attention\w*)$"),
     lambda arg, d, s: arg < 3 and s[-1] != 1 and d[-1] != 1),
)


_STRIDE_OPS = re.compile("|".join(p.pattern for p, _ in _STRIDE_RULES))


def needs_copy(op: str, arg: int, sizes: list[int], strides: list[int]) -> bool:
    """Whether argument `arg` of operator `op`, of these sizes and strides, costs a copy (or a strided kernel)."""
    return any(p.match(op) and rule(arg, sizes, strides) for p, rule in _STRIDE_RULES)


def strided_inputs(ops: Ops, frames: Frames | None, cache: dict[int, str], step_idx: np.ndarray,
                   n_steps: int | None) -> dict:
    """The outermost operators of `_STRIDE_RULES` given an input that `needs_copy`, by the line that called them
    (`site`; `cache` holds the lines found), with how many of them ran in the steps (`step_idx` >= 0)."""
    names = ops.ops.names
    dims_col, strides_col, types_col = ops.ops.extra["dims"], ops.ops.extra["strides"], ops.ops.extra["types"]
    found: dict[tuple[str, str], dict] = {}
    for i, name in enumerate(names):
        if strides_col[i] is None or not _STRIDE_OPS.match(name):
            continue
        if any(_STRIDE_OPS.match(names[a]) for a in ops.ancestors(i)):
            continue
        for arg, (d, s, t) in enumerate(zip(dims_col[i], strides_col[i], types_col[i] or ())):
            if not (isinstance(d, list) and isinstance(s, list) and len(d) >= 2 and len(d) == len(s)):
                continue
            if t not in ELEMENT_BYTES or not needs_copy(name, arg, d, s):
                continue
            where = site(frames, ops, i, cache) if frames else "(no Python stack)"
            entry = found.setdefault((where, name), {"site": where, "op": name, "count": 0, "in_loop": 0,
                                                     "argument": arg, "sizes": d, "strides": s})
            entry["count"] += 1
            entry["in_loop"] += int(step_idx[i] >= 0)
            break
    rows = sorted(found.values(), key=lambda r: -r["count"])
    return {"count": sum(r["count"] for r in rows), "per_step": (sum(r["in_loop"] for r in rows) / n_steps)
            if n_steps else None, "sites": rows[:20]}

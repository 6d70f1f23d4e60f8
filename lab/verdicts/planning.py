"""How many blocks a run needs before it runs: whether a time budget reaches the fewest blocks a design can
decide at, and how many blocks finding two arms equivalent takes at the spread of their calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as sps

from lab.verdicts.designs import Design
from lab.verdicts.intervals import first_decidable
from lab.verdicts.samples import mad


def budget_too_short(budget_s: float, block_s: float, design: Design, done: int = 0) -> str | None:
    """Why a budget of `budget_s` seconds of timing blocks of `block_s` seconds each (after `done` blocks of an earlier
    run) cannot reach the fewest blocks at which `design` can call a change faster or slower, and what budget would;
    None when it can. With fewer than the equivalence interval's fewest, such a run can only end "insufficient
    samples", whatever the change does; with fewer than the faster/slower interval's fewest (one more at the usual
    levels: its per-look alpha is half the equivalence look's), it can find the arms equivalent but never a change,
    however large. The count follows `lab ab`: a block starts only while one more of the median length still fits."""
    needed_eq, needed = first_decidable(design.alpha_look_eq), first_decidable(design.alpha_look)
    blocks = done + max(1, int(budget_s // block_s))
    if blocks >= needed:
        return None
    reach = f"at least {math.ceil((needed - done) * block_s / 60)} min reaches {needed}."
    if blocks >= needed_eq:
        return (f"at {block_s:.0f} s per block, a budget of {budget_s / 60:.3g} min stops after about {blocks} "
                f"block(s): enough to find the arms within the margin, but fewer than the {needed} the rule needs to "
                f"call a change faster or slower (a change of any size would end undecided); {reach}")
    return (f"at {block_s:.0f} s per block, a budget of {budget_s / 60:.3g} min stops after about {blocks} block(s), "
            f"fewer than the {needed_eq} the rule needs to decide anything (it would say insufficient samples) and "
            f"the {needed} it needs to call a change faster or slower; {reach}")



def call_spread(blocks: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """How much one arm's calls spread against each other inside its blocks (the raw calls of each block, `repeat`
    of them): the standard deviation of one call's log time, read robustly as 1.4826 MAD of log(call / the block's
    first call) over every later call of every block, over sqrt(2) since each such ratio holds two calls' noise; with
    how many ratios it rests on. Drift from block to block does not enter it, as it cancels in a block's ratio. None
    under 6 ratios."""
    r = [math.log(c / b[0]) for b in blocks if len(b) > 1 and b[0] > 0 for c in b[1:] if c > 0]
    if len(r) < 6:
        return None
    return 1.4826 * mad(r) / math.sqrt(2), len(r)


def blocks_to_find_equivalent(spread: float, repeat: int, margin: float, design: Design) -> int | None:
    """About how many blocks `design` needs to find two arms that differ by nothing within +-`margin`, where one
    call's log time spreads with `spread` (`call_spread`) and a block times `repeat` calls per arm: a block's log ratio
    then spreads with about spread * sqrt(2 / repeat), and the equivalence interval at the per-look level (a
    signed-rank interval, about sqrt(pi / 3) times as wide as a normal one on normal data) narrows as 1/sqrt(blocks)
    until it fits inside log(1 + margin). Never fewer than the fewest at which that interval can be finite. None
    without a margin. On the committed GPU results the block spread this implies came within a factor of 2 of the
    measured one in most (`benchmarks/call_spread.py`): the count is a rough guide, a factor of 4 either way."""
    if margin <= 0 or spread < 0 or repeat < 1:
        return None
    block_sd = spread * math.sqrt(2 / repeat)
    z = float(sps.norm.ppf(1 - design.alpha_look_eq / 2))
    n = (z * math.sqrt(math.pi / 3) * block_sd / math.log1p(margin)) ** 2
    return max(first_decidable(design.alpha_look_eq), math.ceil(n))

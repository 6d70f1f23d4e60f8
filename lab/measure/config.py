"""How an A/B is timed and decided (`ABConfig`): the design of its blocks, the calls of each block, its profiles and
the trace's bound. A result stores it as `config` (`lab.results.conditions.Timing`)."""

from __future__ import annotations

import dataclasses

from lab.verdicts import stats


@dataclasses.dataclass(frozen=True)
class ABConfig:
    """How an A/B is timed and decided: its design, the calls of a block, the profiles and the trace's bound."""

    #: a fixed design of this many blocks; None: sequential, a look after every block from `min_blocks` until the
    #: interval decides, `max_blocks` are done or `budget_s` is spent
    blocks: int | None = None
    min_blocks: int = 6
    max_blocks: int = 40
    budget_s: float | None = None  # seconds of timing blocks (building, verifying and profiling not counted)
    lead_in: int = 1  # untimed calls at the start of each block, by the arm that goes first
    warmup: int = 0  # untimed calls per arm after each switch
    repeat: int = 2  # timed calls per arm per block, mirrored (C T T C); the block's value is their median
    alpha: float = 0.05
    margin: float = 0.01  # equivalence margin (fraction)
    seed: int = 0
    profile: bool = True
    with_stack: bool = True
    # profiled calls per arm; the trace metrics are their medians with their range: one profiled call's GPU idle
    # moves from call to call by more than most fixes change it (FINDINGS: "one profiled call is not enough")
    profile_calls: int = 3
    #: a file that every cell on this host locks while it profiles and times, so that cells running side by side
    #: (a campaign on several GPUs) never measure at the same time; None: no lock
    timing_lock: str | None = None
    #: arms in worker processes of their own: one pair for every block (uncalibrated: a process effect moves with
    #: its arm) instead of a fresh pair per block (`lab.run.worker.WorkerPairs`)
    one_pair: bool = False
    #: fresh pairs started side by side, ahead of their blocks (`WorkerPairs.at_once`)
    pairs_at_once: int = 1
    #: the bound the profiled calls put on the change (`lab.verdicts.bound`): "decide" reads it after the profiles
    #: and times no block where it alone decides equivalence; "check" reads it and times the blocks anyway (the
    #: calibration of the bound); "off" reads none
    bound: str = "decide"

    @property
    def sequential(self) -> bool:
        return self.blocks is None

    def design(self) -> stats.Design:
        if self.sequential:
            return stats.sequential_design(self.min_blocks, self.max_blocks, self.alpha)
        return stats.fixed_design(self.blocks, self.alpha)

    def describe(self) -> str:
        calls = (f"{self.lead_in} untimed lead-in call, " if self.lead_in else "") + (
            f"{self.warmup} warm-up call(s) per switch, " if self.warmup else "") + f"{self.repeat} timed call(s) per arm"
        if self.sequential:
            budget = f", or {self.budget_s:g} s of blocks" if self.budget_s else ""
            return (f"sequential: blocks until the interval decides ({self.min_blocks} to {self.max_blocks} blocks"
                    f"{budget}); per block {calls}")
        return f"{self.blocks} blocks; per block {calls}"

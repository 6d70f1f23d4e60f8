"""The states a run and a campaign cell can be in: why an A/B's blocks stopped (`Stop`), and a campaign cell's
state (`State`), shared by the engine, the campaign plan (`lab.campaigns`) and the pages that count them."""

from __future__ import annotations

import enum

from lab.verdicts.verdict import Verdict


class State(str, enum.Enum):
    """A campaign cell's state, as the plan decides it from the cell's results and the campaign's run log. Its value
    is the word `lab campaign plan --json` writes and the pages show, so that a value compares equal to its word."""

    MEASURED = "measured"
    UNDECIDED = "undecided"
    #: measured on the lab's old build of a pipeline that build got wrong
    OLD_BUILD = "old build"
    #: a cross-process cell (two diffusers, a history) measured with one pair of worker processes for all its blocks,
    #: the design before fresh pairs, whose process effect is a bias no block count removes
    ONE_PAIR = "one pair"
    #: a census whose result lacks a fix that the catalog now applies to its pipeline
    NEW_FIXES = "new fixes"
    FAILED = "failed"
    PLANNED = "planned"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # as its word's: a set or dict of states finds a state by its word too
        return hash(self.value)


OLD_BUILD, ONE_PAIR, NEW_FIXES = State.OLD_BUILD, State.ONE_PAIR, State.NEW_FIXES
#: every state, in the order the plan and the pages count them
STATES = (State.MEASURED, State.UNDECIDED, State.OLD_BUILD, State.ONE_PAIR, State.NEW_FIXES, State.FAILED,
          State.PLANNED)
#: the states whose cells a campaign run measures (afresh: `--replace`), besides the undecided ones on request
OWED = (State.PLANNED, State.FAILED, State.OLD_BUILD, State.ONE_PAIR, State.NEW_FIXES)
#: the states whose result a run measures afresh (`--replace`): an old build's blocks timed another build, a
#: one-pair design's blocks carry its bias, and a census without a new fix lacks its arm
REMEASURED = (State.OLD_BUILD, State.ONE_PAIR, State.NEW_FIXES)
#: the words of an A/B that stopped (a time limit, a Ctrl-C) in or after its profiles, before its first block: owed,
#: and gone on from (its profiles kept)
NO_BLOCKS_YET = "no blocks yet"


def summary(states, zeros: bool = False) -> str:
    """A campaign's cells counted by state (`117 measured, 31 undecided (11 at their design's most blocks), 137
    planned (40 likely past their design's most if their fixes change nothing) of 285 cells`), from objects with
    `state`, `at_limit` (an undecided A/B whose sequential design ran its most blocks) and `past_design` (a planned
    A/B that the call spread at its setting puts there). `zeros` names the common states that no cell is in too;
    the rare ones only when a cell is."""
    rare = REMEASURED
    counts = {k: sum(s.state == k for s in states) for k in STATES}
    at_limit = sum(bool(getattr(s, "at_limit", False)) for s in states)
    past = sum(bool(getattr(s, "past_design", False)) for s in states if s.state == State.PLANNED)
    notes = {State.UNDECIDED: f" ({at_limit} at their design's most blocks)" if at_limit else "",
             State.PLANNED: f" ({past} likely past their design's most if their fixes change nothing)" if past else ""}
    parts = [f"{v} {k}" + notes.get(k, "") for k, v in counts.items() if v or (zeros and k not in rare)]
    return ", ".join(parts) + f" of {len(states)} cells"


def by_fixes(states) -> list[str]:
    """A campaign's A/B cells counted by what they time, sets of several fixes, one fix, and fixes over a base
    (`--base`), each by verdict (`sets of several fixes: 37 decided (30 faster, 7 equivalent within ±1%), 2
    undecided, 10 planned of 49`), from objects with `state`, `verdict` and a `cell` with `kind`, `fixes` and
    `base`: the counts FINDINGS and the README quote. A measured cell whose timing decided nothing about the speed
    (`not exercised`, `outputs differ`) is counted apart. No line for a kind the campaign has no cell of."""
    groups: dict[str, list] = {"sets of several fixes": [], "one fix": [], "over a base": []}
    for s in states:
        if s.cell.kind == "ab":
            key = "over a base" if s.cell.base else "sets of several fixes" if len(s.cell.fixes) > 1 else "one fix"
            groups[key].append(s)
    lines = []
    for name, group in groups.items():
        if not group:
            continue
        verdicts = [s.verdict or "measured" for s in group if s.state == State.MEASURED]
        decided = [v for v in verdicts if _typed(v).decided]
        parts = []
        for label, found in (("decided", decided), ("settled otherwise", [v for v in verdicts if v not in decided])):
            if found:  # in the order the verdicts are declared (faster, slower, equivalent, ...), then by their words
                counts = sorted({v: found.count(v) for v in found}.items(), key=lambda kv: (_order(kv[0]), kv[0]))
                parts.append(f"{len(found)} {label} ({', '.join(f'{n} {v}' for v, n in counts)})")
        parts += [f"{n} {state}" for state in STATES if state != State.MEASURED
                  and (n := sum(s.state == state for s in group))]
        lines.append(f"{name}: {', '.join(parts)} of {len(group)}")
    return lines


def _typed(words: str) -> Verdict:
    """The verdict behind a cell's words (`equivalent within ±1%`); NO_DATA for words that name none."""
    try:
        return Verdict.from_text(words)
    except ValueError:
        return Verdict.NO_DATA


def _order(words: str) -> int:
    return list(Verdict).index(_typed(words))


class Stop(str, enum.Enum):
    """Why an A/B's blocks stopped (`ABResult.stopped`). Its value is the word a result stores, so that a member
    compares equal to its word and older results read the same."""

    DECIDED = "decided"  # a sequential design's look decided
    MAX_BLOCKS = "max blocks"  # a sequential design ran the most blocks it allows
    BLOCKS_DONE = "blocks done"  # a fixed design ran its blocks
    BUDGET = "budget spent"  # `--budget` was spent
    TIME_LIMIT = "time limit"  # a campaign's time limit came before the next block could end
    INTERRUPTED = "interrupted"  # a Ctrl-C (or a time limit's signal): the blocks done are kept
    NOT_EXERCISED = "not exercised"  # no fix's code ran: one block, then it settles
    BOUNDED = "bounded"  # the trace's bound decided: no block is timed

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:
        return hash(self.value)


#: why a sequential A/B may stop undecided and be continued later (`lab ab --resume`)
RESUMABLE = (Stop.BUDGET, Stop.TIME_LIMIT, Stop.INTERRUPTED)

"""A campaign cell's state (`lab.results.states.State`): an enum whose value is the word the plan's JSON and the
pages write, so that what was written before reads the same; and the counts the pages quote, on literal cells."""

import json
from types import SimpleNamespace

import pytest

from lab.results.states import OWED, STATES, State, by_fixes, summary


def test_a_state_is_its_word_wherever_it_is_written_or_looked_up():
    assert State("old build") is State.OLD_BUILD and State.PLANNED == "planned"
    assert f"{State.NEW_FIXES}" == str(State.NEW_FIXES) == "new fixes" and f"{State.FAILED:>8}" == "  failed"
    assert json.dumps({"state": State.ONE_PAIR}) == '{"state": "one pair"}'
    assert "planned" in {State.PLANNED} and {State.UNDECIDED: 1}["undecided"] == 1  # hashed as its word
    assert set(OWED) < set(STATES) and State.MEASURED not in OWED and State.UNDECIDED not in OWED
    with pytest.raises(ValueError):
        State("interrupted")  # a result's words, not a state


def cell(kind: str = "ab", fixes: tuple = ("a",), base: tuple = ()) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, fixes=fixes, base=list(base))


def status(state: State, verdict: str | None = None, **cells) -> SimpleNamespace:
    return SimpleNamespace(state=state, verdict=verdict, cell=cell(**cells), at_limit=False, past_design=False)


def test_the_cells_are_counted_by_state_in_the_order_of_the_states():
    states = [status(State.MEASURED, "faster"), status(State.PLANNED), status(State.PLANNED),
              status(State.OLD_BUILD, "faster")]
    assert summary(states) == "1 measured, 1 old build, 2 planned of 4 cells"
    # the common states with no cell are named on request, the rare ones only where a cell is in them
    assert summary(states[:1], zeros=True) == "1 measured, 0 undecided, 0 failed, 0 planned of 1 cells"


def test_the_a_b_cells_are_counted_by_what_they_time_and_by_verdict():
    states = [status(State.MEASURED, "faster, within ±1%", fixes=("a", "b")), status(State.MEASURED, "faster"),
              status(State.MEASURED, "not exercised"), status(State.UNDECIDED, "undecided"),
              status(State.MEASURED, "slower", base=("c",)), status(State.MEASURED, "measured", kind="census")]
    assert by_fixes(states) == ["sets of several fixes: 1 decided (1 faster, within ±1%) of 1",
                                "one fix: 1 decided (1 faster), 1 settled otherwise (1 not exercised), 1 undecided "
                                "of 3", "over a base: 1 decided (1 slower) of 1"]

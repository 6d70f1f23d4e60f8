"""`Patcher`: every change undone exactly, newest first, also a state change given as a callback, also when one
callback fails."""

from __future__ import annotations

import pytest

from lab.apply.patching import Patcher


class Owner:
    kept = "original"


def test_callbacks_run_in_their_turn_and_a_failing_one_still_lets_every_attribute_go_back():
    seen: list[str] = []
    patcher = Patcher()
    patcher.setattr(Owner, "kept", "patched")
    patcher.on_restore(lambda: seen.append(f"first callback saw {Owner.kept}"))
    patcher.setattr(Owner, "added", 1)

    def failing() -> None:
        seen.append("failing callback")
        raise RuntimeError("boom")

    patcher.on_restore(failing)
    with pytest.raises(RuntimeError, match="boom"):
        patcher.restore()
    # newest first: the failing callback, then `added` removed, then the first callback (before `kept` goes back)
    assert seen == ["failing callback", "first callback saw patched"]
    assert Owner.kept == "original" and not hasattr(Owner, "added")
    patcher.restore()  # safe twice: nothing left to undo
    assert seen == ["failing callback", "first callback saw patched"]

"""What an A/B concluded, as one of a fixed set of values (`Verdict`), and the words a page shows for it.

The statistics decide faster, slower or equivalent (`lab.verdicts.stats`); the A/B engine adds the outcomes that are
not about the speed (the fix's code never ran, the outputs differ, no block completed). A result stores the value
(`"faster"`); "faster, within ±1%" is that value with the equivalence the statistics also found, written by
:meth:`Verdict.text`, never parsed back except from result files written before verdicts had a type
(:meth:`Verdict.from_text`, used only when such a file is read).
"""

from __future__ import annotations

import enum


class Verdict(enum.Enum):
    FASTER = "faster"
    SLOWER = "slower"
    EQUIVALENT = "equivalent"
    #: equivalent, decided with the bound the trace puts on the change (`lab.verdicts.bound`): by the bound alone,
    #: without timing blocks, or by the blocks' interval cut by it
    BOUNDED = "bounded"
    UNDECIDED = "undecided"
    INSUFFICIENT = "insufficient samples"
    NOT_EXERCISED = "not exercised"
    OUTPUTS_DIFFER = "outputs differ"
    NO_DATA = "no data"
    FAILED = "failed"  # a sweep point whose run raised

    @property
    def decided(self) -> bool:
        """Whether the timing decided something about the speed: faster, slower or equivalent."""
        return self in (Verdict.FASTER, Verdict.SLOWER, Verdict.EQUIVALENT, Verdict.BOUNDED)

    @property
    def changed_speed(self) -> bool:
        return self in (Verdict.FASTER, Verdict.SLOWER)

    def text(self, equivalent: bool = False, margin: float = 0.01) -> str:
        """The words a page shows: "faster", "faster, within ±1%" (faster, and also inside the margin),
        "equivalent within ±1%", "equivalent within ±1% (bounded by the trace)", "undecided", ..."""
        within = f"within ±{margin * 100:g}%"
        if self is Verdict.EQUIVALENT:
            return f"equivalent {within}"
        if self is Verdict.BOUNDED:
            return f"equivalent {within} (bounded by the trace)"
        if self.changed_speed and equivalent:
            return f"{self.value}, {within}"
        return self.value

    @property
    def color(self) -> str:
        """green faster, red slower, blue equivalent, cyan equivalent by the trace's bound, grey anything else
        (matplotlib colour names)."""
        return {Verdict.FASTER: "tab:green", Verdict.SLOWER: "tab:red", Verdict.EQUIVALENT: "tab:blue",
                Verdict.BOUNDED: "tab:cyan"}.get(self, "tab:gray")

    @classmethod
    def from_text(cls, text: str) -> Verdict:
        """The value behind the words of a result file written before verdicts had a type (result format 2):
        "faster, within ±1%" -> FASTER, "equivalent within ±2%" -> EQUIVALENT; format 1's "no significant change"
        is what is now called undecided."""
        if text.startswith(("faster", "slower")):
            return cls(text.split(",")[0])
        if text.startswith("equivalent"):
            return cls.BOUNDED if text.endswith("(bounded by the trace)") else cls.EQUIVALENT
        if text == "no significant change":
            return cls.UNDECIDED
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown verdict {text!r}") from None

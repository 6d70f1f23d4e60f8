"""The verifying calls of an A/B, as stored: whether both arms' outputs agree (bit-identical, within the tolerance,
within the compiler's rounding, numerically equivalent against a reference, or not), and whether the fixes' code
and a diff's changed lines ran."""

from __future__ import annotations

import msgspec


class ChangedLines(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """For a change given as a diff: how many of its changed lines ran in the verifying call."""

    changed: int
    ran: int
    not_run: list[str] = []


class CompilerRounding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A compiled A/B whose outputs differed beyond the tolerance, checked against the compiler's own rounding: both
    arms once more with the compiled code run eagerly (`lab.measure.ab.within_compiler_rounding`)."""

    eager_diff: float  # the arms' difference run eagerly: what the fix changes in the computation
    control_compiled_vs_eager: float  # what compiling changes in each arm's output
    test_compiled_vs_eager: float
    accepted: bool  # the arms equal eagerly, and apart compiled by no more than compiling moves either


class Numerics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Outputs that differed beyond the tolerance, both held against a reference of higher precision
    (`lab.verdicts.numerics`): each arm's relative error against it and what the rule made of them."""

    label: str  # "numerically equivalent" or "outputs differ"
    reference: str  # "float32 on cuda"
    control_error: float | None = None  # None: not checked (`reason` says why)
    test_error: float | None = None
    bound: float | None = None  # the largest test error the rule accepts
    reason: str = ""
    noise_replayed: str | None = None  # "2 of 2": the reference started from the arms' own noise

    @property
    def accepted(self) -> bool:
        return self.label == "numerically equivalent"


class Verify(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The verifying calls: both arms' outputs with one seed, and whether the fixes' code ran."""

    identical: bool = False
    max_abs_diff: float | None = None
    tolerance: float | None = None
    within_tolerance: bool = True
    exercised: dict[str, int] = {}
    calls_counted: dict[str, int] = {}
    output_shape: list[int] | None = None
    lines: dict[str, ChangedLines] | None = None
    detail: str | None = None
    compiler_rounding: CompilerRounding | None = None
    #: outputs apart beyond the tolerance held against a reference of higher precision
    numerics: Numerics | None = None
    #: for a fix that changes the outputs on purpose (a cache's decisions), eager, in a cache setting: how far the
    #: setting itself moves the control's output (one call without it), what the fix's difference reads against
    setting_moves: float | None = None
    #: what a setting decided from the data in each arm's verifying call ("control"/"test" -> `first_block_cache:
    #: computed` / `: skipped` -> transformer calls); the test arm's from its counting call when compiled
    decisions: dict[str, dict[str, int]] | None = None
    #: how long the verifying calls took, kept with them as a profile's time is
    seconds: float | None = None
    #: the `created` of the run that made this verification, where a run going on kept it (compiled, its warm-up alone
    #: reaching what the blocks time: `lab.measure.ab.kept_verification`); None where this run made it
    kept_from: str | None = None

    @property
    def equality(self) -> str:
        """How the outputs compared: "bit-identical", "within the tolerance", "within the compiler's rounding",
        "numerically equivalent" or "outputs differ"."""
        if self.identical:
            return "bit-identical"
        if not self.within_tolerance:
            return "outputs differ"
        if self.numerics is not None and self.numerics.accepted:
            return "numerically equivalent"
        if self.compiler_rounding is not None and self.compiler_rounding.accepted:
            return "within the compiler's rounding"
        return "within the tolerance"

"""What a stored A/B result lets a run going on from its blocks keep rather than make again: `lab.measure.ab` keeps
it, and the campaign plan counts the time that saves."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.results.schema import ABResult, Verify


def kept_verification(prior: ABResult | None) -> Verify | None:
    """The verification that a run going on from `prior`'s blocks keeps rather than makes again, or None.

    The verification says whether the outputs match and the fixes' code ran: the same code, settings and software (what
    `lab.measure.ab.resume_problems` checks) say the same again. It is also, for the blocks, more calls before the
    first: in eager mode each arm's second call, the end of its warm-up, so an eager run always verifies again.
    Compiled, it is kept where `prior`'s verifying calls compiled nothing (`compilation.verify`: the warm-up alone had
    compiled what the blocks run), or, where `prior` kept its own from the run before, where nothing compiled after its
    warm-up (`compilation.steady`). A slow compiled cell can spend a quarter of a device call verifying again, before
    blocks that take longer than what is left: a run going on could then never time one (FINDINGS)."""
    # (a run goes on only from a result of its own mode)
    if prior is None or not prior.mode.startswith("compile") or prior.verify is None \
            or not (prior.phase_s or {}).get("call"):
        return None
    if not prior.verify.within_tolerance or not prior.verify.exercised:
        return None
    phases = prior.compilation or {}
    evidence = phases.get("steady" if prior.verify.kept_from else "verify")
    if not evidence or evidence.get("compilations") or evidence.get("recompiles"):
        return None
    return prior.verify

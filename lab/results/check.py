"""Whether a typed result's numbers agree with themselves: the check every result file passes as it is read
(`lab.results.store`), so that a hand-edited or damaged result is refused by file and field, never published by
`lab table`, never decided again by `--restat` and never gone on from by `lab ab --resume`.

Pure: a typed result in, the problems out (empty when it holds together). Two kinds of problem:
- the measurement: every call and block time is a number above zero, both arms hold the same blocks (they are
  paired), and no design ran more blocks than its `max_blocks`;
- what is derived from it (`derived`): the estimate lies inside its own intervals, no interval is reversed, and the
  verdict is one its interval supports ("faster" with an interval that holds 1 is not). `lab table --restat`
  derives these again from the blocks, so it asks only for the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from lab.verdicts.verdict import Verdict

#: how far a stored estimate may sit outside its stored interval and still count as inside: the two are written as
#: rounded decimal floats of one computation, which never differ by more than a few units in the last place
ROUNDING = 1e-9


def check_result(result: Any, *, derived: bool = True) -> list[str]:
    """Every contradiction in `result` (an A/B, a sweep or a history; other kinds hold no verdict of their own), each
    naming its field (`stats.ci`, `samples.test.wall_ms[3]`, `points[2].stats.ratio`)."""
    kind = getattr(result, "kind", None)
    if kind == "ab":
        return _outcome(result, "", derived)
    if kind == "sweep":
        return [p for k, point in enumerate(result.points) for p in _outcome(point, f"points[{k}].", derived)]
    if kind == "history" and derived:
        return [p for k, row in enumerate(result.releases)
                for p in _interval(row.ratio, row.ci, f"releases[{k}].ratio", f"releases[{k}].ci")]
    return []


def _outcome(outcome: Any, at: str, derived: bool) -> list[str]:
    """The problems of one A/B outcome (a whole `ab` result, or one point of a sweep); `at` prefixes its fields."""
    problems = _samples(outcome.samples, at) if outcome.samples is not None else []
    blocks = len(outcome.samples.control.wall_ms) if outcome.samples is not None else 0
    design = getattr(outcome, "design", None) or (outcome.stats.design if outcome.stats is not None else None) or {}
    most = design.get("max_blocks")
    if isinstance(most, int) and blocks > most:
        problems.append(f"{at}samples hold {blocks} blocks, more than its design's max_blocks {most}")
    if derived and outcome.stats is not None:
        problems += _stats(outcome.stats, outcome.verdict, blocks, f"{at}stats.")
    bound = getattr(outcome, "bound", None)
    if derived and outcome.verdict is Verdict.BOUNDED and outcome.stats is None and not (bound and bound.decided):
        problems.append(f"{at}verdict \"bounded\" without timing blocks, but {at}bound "
                        + (f"[{bound.lo:.6g}, {bound.hi:.6g}] is not inside ±{bound.margin * 100:g}%"
                           if bound and not bound.reason else "decides nothing"))
    return problems


def _samples(samples: Any, at: str) -> list[str]:
    problems = []
    for arm in ("control", "test"):
        times = getattr(samples, arm)
        for name in ("wall_ms", "raw_wall_ms", "steps_ms", "raw_steps_ms"):
            bad = next(_not_positive(getattr(times, name)), None)
            if bad is not None:
                where, value = bad
                problems.append(f"{at}samples.{arm}.{name}{where} is {value!r}, not a time above zero")
    control, test = len(samples.control.wall_ms), len(samples.test.wall_ms)
    if control != test:
        problems.append(f"{at}samples.control.wall_ms holds {control} blocks and {at}samples.test.wall_ms {test}: "
                        "the arms' blocks are paired")
    return problems


def _not_positive(values: Any, where: str = "") -> Iterable[tuple[str, Any]]:
    """`([i][j], value)` of each value in the nested lists `values` that is not a finite number above zero."""
    if isinstance(values, (list, tuple)):
        for k, value in enumerate(values):
            yield from _not_positive(value, f"{where}[{k}]")
    elif not _positive(values):
        yield where, values


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _stats(s: Any, verdict: Verdict, blocks: int, at: str) -> list[str]:
    problems = [f"{at}{name} is {getattr(s, name)!r}, not a number above zero"
                for name in ("ratio", "control_median", "test_median") if not _positive(getattr(s, name))]
    if blocks and s.n != blocks:
        problems.append(f"{at}n is {s.n}, but the samples hold {blocks} blocks")
    problems += _interval(s.ratio, s.ci, f"{at}ratio", f"{at}ci")
    problems += _interval(s.ratio, s.ci_equivalence, f"{at}ratio", f"{at}ci_equivalence")
    if not problems:
        problems += _supported(verdict, s, at)
    return problems


def _interval(ratio: float | None, ci: Sequence[float] | None, ratio_at: str, ci_at: str) -> list[str]:
    """An interval is two numbers of at least zero (an end may be infinite: too few blocks for a finite one), low
    first, with the estimate between them."""
    if ci is None:
        return []
    low, high = ci
    if any(math.isnan(x) or x < 0 for x in (low, high)):
        return [f"{ci_at} {_shown(ci)} is not an interval of ratios"]
    if low > high:
        return [f"{ci_at} {_shown(ci)} is reversed (low > high)"]
    if ratio is not None and _positive(ratio) and not low * (1 - ROUNDING) <= ratio <= high * (1 + ROUNDING):
        return [f"{ratio_at} {ratio:.6g} lies outside its own interval {ci_at} {_shown(ci)}"]
    return []


def _supported(verdict: Verdict, s: Any, at: str) -> list[str]:
    """Whether the interval supports the verdict as `lab.verdicts.stats.Decision` reads it off: faster below 1,
    slower above 1 (and so neither is equivalent), equivalent (and "faster, within ±m") inside the margin, undecided
    neither. Verdicts that do not
    rest on the interval (not exercised, outputs differ) and intervals too wide to be finite pass."""
    (low, high), m = s.ci, s.margin
    low_eq, high_eq = s.ci_bounded if s.bounded and s.ci_bounded is not None else s.ci_equivalence
    inside = 1 - m <= low_eq * (1 + ROUNDING) and high_eq * (1 - ROUNDING) <= 1 + m
    problems = []
    if verdict is Verdict.BOUNDED and not (s.bounded and inside):
        problems.append(f"verdict \"bounded\" but {at}ci_bounded {_shown(s.ci_bounded or (0, math.inf))} is not "
                        f"inside ±{m * 100:g}%")
    if verdict is Verdict.BOUNDED and (high < 1 or low > 1):
        problems.append(f"verdict \"bounded\" but {at}ci {_shown(s.ci)} decides it "
                        f"{'faster' if high < 1 else 'slower'}")
    if verdict is Verdict.FASTER and high > 1:
        problems.append(f"verdict \"faster\" but {at}ci {_shown(s.ci)} reaches above 1")
    if verdict is Verdict.SLOWER and low < 1:
        problems.append(f"verdict \"slower\" but {at}ci {_shown(s.ci)} reaches below 1")
    if (verdict is Verdict.EQUIVALENT or (verdict.changed_speed and s.equivalent)) and not inside:
        problems.append(f"verdict \"{verdict.text(s.equivalent, m)}\" but {at}ci_equivalence {_shown(s.ci_equivalence)} "
                        f"is not inside ±{m * 100:g}%")
    if verdict is Verdict.EQUIVALENT and (high < 1 or low > 1):
        problems.append(f"verdict \"equivalent\" but {at}ci {_shown(s.ci)} decides it "
                        f"{'faster' if high < 1 else 'slower'}")
    if verdict is Verdict.UNDECIDED and (high < 1 or low > 1 or inside):
        problems.append(f"verdict \"undecided\" but {at}ci {_shown(s.ci)} and {at}ci_equivalence "
                        f"{_shown(s.ci_equivalence)} decide it")
    return problems


def _shown(ci: Sequence[float]) -> str:
    return "[" + ", ".join(f"{x:.6g}" for x in ci) + "]"

"""The page of a `lab calibrate` result: its false-positive rate and power against alpha, what the trials took, and
whether the A/A blocks hold the assumptions the rule's alpha rests on (from the trials the result stores)."""

from __future__ import annotations

import math
from pathlib import Path

from lab.pages import figure
from lab.results.schema import AASummary, CalibrationResult, CalibrationTrial, PositiveSummary
from lab.verdicts import stats


def _effort_text(part: AASummary | PositiveSummary) -> str:
    if part.blocks_median is None:
        return "n/a"
    return (f"{part.blocks_median:g} blocks (max {part.blocks_max}), {part.seconds_median:.1f} s "
            f"(max {part.seconds_max:.1f} s)")


def _ratios(trials: list[CalibrationTrial]) -> list[float]:
    """Every block's ratio (test / control) of the trials, pooled."""
    return [b / a for t in trials for a, b in zip(t.control_ms, t.test_ms) if a > 0]


def block_ratios(trials: list[CalibrationTrial]) -> dict | None:
    """The per-block ratios (test / control) of trials pooled: their median and middle 90 %. In an A/A they say
    how far two arms running the same code move apart from block to block in this design."""
    ratios = sorted(_ratios(trials))
    if len(ratios) < 2:
        return None
    at = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]  # noqa: E731
    return {"blocks": len(ratios), "median": stats.median(ratios), "p05": at(0.05), "p95": at(0.95)}


def _trial_color(t: CalibrationTrial) -> str:
    """green called faster, red slower, blue equivalent, grey undecided (as the A/B pages colour verdicts)."""
    from lab.verdicts.verdict import Verdict

    if t.direction == "faster":
        return Verdict.FASTER.color
    if t.direction == "slower":
        return Verdict.SLOWER.color
    return Verdict.EQUIVALENT.color if t.verdict.startswith("equivalent") else Verdict.UNDECIDED.color


def plot(result: CalibrationResult, path: Path) -> Path | None:
    """Each trial's estimate with the interval it was decided on, sorted, coloured by what the rule called it (A/A on
    the left, the positive control in the middle when it ran), and the A/A per-block ratios (right): what the table's
    rate and spread are made of."""
    kinds = [(label, trials) for label, trials in (("A/A", result.trials.aa), ("positive control",
                                                                                  result.trials.positive)) if trials]
    if not kinds:
        return None
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(4.2 * (len(kinds) + 1), 3.8),
                             gridspec_kw={"width_ratios": [2] * len(kinds) + [1.4]})
    for ax, (label, trials) in zip(axes, kinds):
        ordered = sorted(trials, key=lambda t: t.ratio)
        for i, t in enumerate(ordered):
            lo, hi = t.ci if t.ci and all(map(math.isfinite, t.ci)) and t.ci[0] > 0 else (t.ratio, t.ratio)
            ax.errorbar([i], [t.ratio], yerr=[[t.ratio - lo], [hi - t.ratio]], fmt="o", ms=3, capsize=2,
                        color=_trial_color(t))
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        if label != "A/A" and result.positive.expected_effect_ms and result.call_ms_median:
            ax.axhline(1 - result.positive.expected_effect_ms / result.call_ms_median, color="tab:green", lw=1, ls=":",
                       label="the stall's expected ratio")
            ax.legend(fontsize=7, loc="best")
        called = sum(t.direction is not None for t in trials)
        ax.set_title(f"{label}: {called} of {len(trials)} called faster or slower", fontsize=9)
        ax.set_xlabel("trial (sorted by its estimate)")
        ax.set_ylabel("test / control, with the interval decided on")
    ratios = _ratios(result.trials.aa)
    hist = axes[-1]
    if ratios:
        hist.hist(ratios, bins=min(40, max(8, len(ratios) // 5)), orientation="horizontal", color="tab:grey")
        hist.axhline(1.0, color="grey", lw=1, ls="--")
    hist.set_title(f"A/A per-block ratios ({len(ratios)} blocks)", fontsize=9)
    hist.set_xlabel("blocks")
    where = result.environment.gpu or "CPU"
    title = (f"lab ab on {result.scenario} ({result.size}{f', {result.layers} blocks' if result.layers else ''}, "
             f"{result.mode}), {where}" + (f": {result.processes}" if result.processes else ""))
    fig.suptitle(textwrap.fill(title, 45 * (len(kinds) + 1)), fontsize=9)
    fig.tight_layout()
    return figure.save(fig, path)


def markdown(result: CalibrationResult, plot_name: str | None = None) -> str:
    aa, pos, env = result.aa, result.positive, result.environment
    lo, hi = aa.rate_ci95
    plo, phi = pos.power_ci95
    ok = "within" if aa.within_alpha_plus_sampling_error else "ABOVE"
    design = stats.Design.from_dict(result.design) if result.design else None
    rule = (f"Rule as `lab ab` uses it: {design.describe()}. Blocks: {result.block_layout}." if design
            else "Rule: the fixed-design signed-rank test this calibration was made with (before the sequential rule).")
    call = f" One call takes {result.call_ms_median:.1f} ms (median)." if result.call_ms_median is not None else ""
    aa_row = (f"| A/A false-positive rate at alpha {aa.alpha} | {aa.trials} | {aa.false_positives} / "
              f"{aa.trials} = {aa.rate:.3f} ({ok} alpha + sampling error "
              f"{aa.alpha + aa.sampling_error:.3f}) | {lo:.3f}–{hi:.3f} | {_effort_text(aa)} |"
              if aa.trials else f"| A/A false-positive rate at alpha {aa.alpha} | 0 | not measured | | |")
    pos_label = (f"| power: {pos.stall_ms_per_step} ms stall per step ({pos.expected_effect_ms:.1f} ms per call) "
                 "removed")
    pos_row = (f"{pos_label} | {pos.trials} | {pos.detected} / {pos.trials} = {pos.power:.3f} called faster "
               f"(median ratio {pos.median_ratio:.4f}) | {plo:.3f}–{phi:.3f} | {_effort_text(pos)} |"
               if pos.trials else f"{pos_label} | 0 | not measured | | |")
    r = block_ratios(result.trials.aa)
    spread = ([f"A/A per-block ratios (test/control, {r['blocks']} blocks): median {r['median']:.3f}, middle 90% "
               f"{r['p05']:.3f}–{r['p95']:.3f}: how far two arms running the same code move apart from block to "
               "block in this design; an effect much smaller than this spread needs many blocks.", ""] if r else [])
    cut = (["**Interrupted** (Ctrl-C or a time limit): the table holds the trials that completed; a trial cut short "
            "is left out.", ""] if result.interrupted else [])
    return "\n".join([
        f"# Calibration of `lab ab` on `{result.scenario}` ({result.size}"
        f"{', %d blocks' % result.layers if result.layers else ''}, {result.mode}, {result.steps} steps)", "",
        f"Machine: {env.gpu}, {env.cpus} CPUs; torch {env.torch}, diffusers {env.diffusers}, "
        f"lab {env.lab_commit}.{call}", "",
        rule + (f" Processes: {result.processes}." if result.processes else ""), "",
        *cut,
        "| check | trials | result | 95% CI (Wilson) | to a verdict, median |", "|---|---|---|---|---|",
        aa_row, pos_row, "",
        f"A/A verdicts: {aa.verdicts}. Positive-control verdicts: {pos.verdicts}.", "",
        *spread, *([f"![each trial's estimate and interval, and the A/A block ratios]({plot_name})", ""] if plot_name
                   else []),
        *process_paragraph(result), *null_paragraph(result),
        *runs_paragraph(result),
        *([f"Note: {result.note}", ""] if result.note else []),
        f"Command: `{result.command}`", "",
    ])


def runs_paragraph(result: CalibrationResult) -> list[str]:
    """Which trials came from a second (third, ...) run that went on from the same earlier trials (`lab calibrate
    --merge`, or a file merged before it existed); none when every trial is the first run's."""
    parts = []
    for kind, trials in (("A/A", result.trials.aa), ("positive", result.trials.positive)):
        runs: dict[str, list[int]] = {}
        for t in trials:
            if t.run:
                runs.setdefault(t.run, []).append(t.trial)
        parts += [f"{kind} trials {_numbers(sorted(n))} of run {run}" for run, n in sorted(runs.items())]
    if not parts:
        return []
    return [f"Trials measured twice by number: {'; '.join(parts)}. Each such run went on from the same earlier trials "
            "(on another GPU, or in a call that did not yet see the other's); its seeds, which set only the arm "
            "order, repeat, and its calls are its own.", ""]


def _numbers(n: list[int]) -> str:
    """[2, 3, 4, 6] -> "2–4, 6"."""
    spans, start = [], None
    for i, x in enumerate(n):
        if start is None:
            start = x
        if i + 1 == len(n) or n[i + 1] != x + 1:
            spans.append(f"{start}–{x}" if x > start else f"{x}")
            start = None
    return ", ".join(spans)


def null_paragraph(result: CalibrationResult) -> list[str]:
    """Whether the A/A trials say the rule fails: the exact chance of as many false positives at a true rate of
    alpha, and the checks of the blocks against what alpha rests on (`stats.null_checks`)."""
    aa = result.aa
    if not aa.trials:
        return []
    if aa.false_positives:
        tail = stats.binomial_tail(aa.false_positives, aa.trials, aa.alpha)
        reading = ("so the count alone is evidence that the rate exceeds alpha" if tail < 0.05 else
                   "so the count is no evidence that the rate exceeds alpha")
        text = (f"If the rule's false-positive rate were exactly alpha = {aa.alpha:g}, {aa.false_positives} or more "
                f"in {aa.trials} trials would happen with probability {tail:.3f} (exact binomial), {reading}.")
    else:
        text = f"No false positive in {aa.trials} trials."
    logs = [[math.log(b / a) for a, b in zip(t.control_ms, t.test_ms) if a > 0 and b > 0] for t in result.trials.aa]
    checks = stats.null_checks(logs)
    if checks is not None:
        between, serial = (_p(p) for p in (checks.between_trials_p, checks.serial_p))
        broken = checks.broken()
        text += (f" The rule keeps alpha for any blocks that are symmetric around 1 and independent; on the "
                 f"{checks.blocks} A/A blocks: symmetric around 1 (signed-rank p = {_p(checks.symmetry_p)}), trials "
                 f"alike (Kruskal-Wallis p = {between}), consecutive blocks independent (Spearman p = {serial}): "
                 + (f"**the blocks reject {'; '.join(broken)}**, so alpha does not hold for this design."
                    if broken else f"none rejected at {stats.NULL_CHECK_P:g}."))
        if checks.alternating():
            text += (f" Consecutive blocks are anti-correlated (Spearman rho = {checks.serial_rho:.2f}): an effect "
                     "that flips from block to block" + _order_text(result) + ", which cancels between blocks and "
                     "makes the rule's wrong calls fewer, not more.")
    return [text, ""]


def _p(p: float | None) -> str:
    """A p-value as the page prints it: two decimals, or one significant digit below 0.01 (so that a p that rejects
    at 0.01 does not print as 0.01)."""
    return "n/a" if p is None else f"{p:.2f}" if p >= 0.01 else f"{p:.1g}"


def _order_text(result: CalibrationResult) -> str:
    """The order effect of the A/A blocks (`stats.order_effect`): the arm timed first in a block against second."""
    trials = [t for t in result.trials.aa if len(t.first) == len(t.control_ms)]
    effect = stats.order_effect([c for t in trials for c in t.control_ms], [x for t in trials for x in t.test_ms],
                                [f == "test" for t in trials for f in t.first])
    if effect is None:
        return ""
    return (f", as the order does: the arm timed second in a block ran {abs(effect) * 100:.1f}% "
            f"{'slower' if effect > 0 else 'faster'} than when timed first, and the counterbalanced order "
            "alternates which arm that is")


def process_paragraph(result: CalibrationResult) -> list[str]:
    """For a calibration across worker processes: how much of the A/A blocks' spread is the process effect, read off
    the timed calls grouped by the process that made them (`stats.process_spread`), and what more calls per block
    could and could not buy."""
    if not result.config.get("isolated"):
        return []  # in one process both arms share every block's conditions: they cancel in its ratio
    one_pair = bool((result.config.get("timing") or {}).get("one_pair"))
    groups = []
    for trial in result.trials.aa:
        for blocks in trial.calls_ms.values():
            groups += [[c for block in blocks for c in block]] if one_pair else [list(b) for b in blocks]
    spread = stats.process_spread(groups)
    if spread is None:
        return []
    pct = lambda sd: 100 * math.expm1(sd)  # noqa: E731 - one standard deviation on the log scale, as a share
    return [(f"Where that spread comes from (the A/A's timed calls grouped by the process that made them: "
             f"{spread.processes} processes of {spread.calls_per_process:g} calls on average): a call moves "
             f"{pct(spread.within_sd):.1f}% around its own process's level, and the processes' levels differ by "
             f"{pct(spread.between_sd):.1f}% (one standard deviation, log scale), so the process makes "
             f"{100 * spread.process_share:.0f}% of the variance of a block's ratio (one process per arm, "
             f"{pct(spread.block_sd()):.1f}% per block). More calls per block leave the process effect as it is: at "
             f"100 calls per process a block would still spread {pct(spread.block_sd(100)):.1f}%; only more "
             "processes (more blocks, or several per arm and block) average it out. At this spread a 5% change needs "
             f"about {spread.blocks_for(0.05):,} blocks to be found 4 times in 5 (a fixed two-sided test at 5%, "
             "normal approximation; the sequential rule needs more)."), ""]

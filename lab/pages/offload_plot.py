"""Where an offloaded call's time goes, and what the model-offload fixes take out of it: one bar per arm of each GPU
A/B of `model_offload_keep_host` and `model_offload_pinned` in model CPU offload (eager, latents), split into the
first step (which holds the move of the transformer to the GPU), the later steps, and the rest of the call (the copy
back after the loop, among the rest). Written by `lab table` as `results/model_offload.png`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from lab import results
from lab.base.naming import device_tag_of
from lab.pages import figure
from lab.results.schema import ABResult

OFFLOAD_PNG = "model_offload.png"
FIXES = ("model_offload_keep_host", "model_offload_pinned")
PIPELINES = ("flux", "flux2", "qwenimage", "ltx2", "wan")  # the order of the panels


@dataclass(frozen=True)
class Bar:
    """One arm of one A/B, in milliseconds: its call median split by its per-step medians."""
    label: str
    first_step: float
    later_steps: float
    rest: float  # the call median minus the step medians (medians do not add exactly: at least 0)

    @property
    def call(self) -> float:
        return self.first_step + self.later_steps + self.rest


def bars(result: ABResult) -> tuple[Bar, Bar] | None:
    """The control and test arms of one A/B as bars, or None when it has no call medians or step times."""
    if result.stats is None or not result.step_times:
        return None
    fix = result.fixes[0]
    named = {"control": " + ".join(result.base) if result.base else "upstream", "test": fix}
    out = []
    for arm, median in (("control", result.stats.control_median), ("test", result.stats.test_median)):
        steps = result.step_times.get(arm) or []  # per-step medians over the blocks (`lab.measure.ab.step_summary`)
        if not steps:
            return None
        out.append(Bar(named[arm], steps[0], sum(steps[1:]), max(median - sum(steps), 0.0)))
    return out[0], out[1]


def offload_results(results_dir: Path) -> dict[str, list[ABResult]]:
    """Per pipeline, the GPU A/Bs of one model-offload fix alone (over a base or not) in model CPU offload, eager,
    returning latents, decided or not, in the order keep-host, pinned, pinned over keep-host."""
    found: dict[str, list[ABResult]] = {}
    for _, r in results.all_results(results_dir / "ab"):
        if (results.on_gpu(r) and r.settings == ["model_cpu_offload"] and r.mode.startswith("eager")
                and not r.decoded and len(r.fixes) == 1 and r.fixes[0] in FIXES and r.scenario in PIPELINES):
            found.setdefault(r.scenario, []).append(r)
    for rs in found.values():
        rs.sort(key=lambda r: (FIXES.index(r.fixes[0]), bool(r.base)))
    return found


def plot(results_dir: Path) -> Path | None:
    """One panel per pipeline, one pair of bars per A/B (its control and its test arm, measured in the same blocks);
    pairs from different A/Bs ran in different device calls, maybe on different hosts, so only the two bars of a pair
    compare directly."""
    found = {p: rs for p, rs in offload_results(results_dir).items() if any(bars(r) for r in rs)}
    if not found:
        return None
    path = results_dir / OFFLOAD_PNG
    key = figure.key(sys.modules[__name__], [
        (p, [(bars(r), r.stats.ratio if r.stats else None, r.stats.n if r.stats else 0,
              device_tag_of(r.environment.gpu), r.verdict.changed_speed, r.layers) for r in found[p]])
        for p in PIPELINES if p in found])
    if figure.current(path, key):
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pipelines = [p for p in PIPELINES if p in found]
    fig, axes = plt.subplots(1, len(pipelines), figsize=(3.3 * len(pipelines), 4.6), squeeze=False)
    parts = (("first_step", "first step (holds the move to the GPU)", "#d62728"),
             ("later_steps", "later steps", "#1f77b4"),
             ("rest", "rest of the call (the copy back, among the rest)", "#ff7f0e"))
    for ax, pipeline in zip(axes[0], pipelines):
        x, ticks, labels = 0.0, [], []
        for r in found[pipeline]:
            pair = bars(r)
            if pair is None:
                continue
            for bar in pair:
                bottom = 0.0
                for field, _, color in parts:
                    value = getattr(bar, field) / 1000
                    ax.bar(x, value, bottom=bottom, color=color, width=0.8)
                    bottom += value
                ticks.append(x)
                labels.append(bar.label.replace("model_offload_", "").replace("_", " "))
                x += 1
            blocks = r.stats.n if r.stats else 0
            gpu = device_tag_of(r.environment.gpu).upper()  # A/Bs of one fix on two hosts stand side by side
            ax.annotate(f"{r.stats.ratio:.3f}\n{gpu}" + ("" if r.verdict.changed_speed else f", {blocks} blocks"),
                        (x - 1.5, max(b.call for b in pair) / 1000), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7)
            x += 0.6
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the ratios
        ax.set_xticks(ticks, labels, rotation=60, ha="right", fontsize=7)
        depth = f", {found[pipeline][0].layers} blocks" if found[pipeline][0].layers else ""
        ax.set_title(f"{pipeline}{depth}", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("seconds per call (medians)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for _, _, color in parts]
    fig.legend(handles, [label for _, label, _ in parts], loc="lower center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("Model CPU offload, eager, one GPU: each pair of bars is one A/B (control, test; the number is its "
                 "test/control ratio)", fontsize=9)
    return figure.save(fig, path, tight=True, key=key)

"""Where each fix matters in the settings users run: the A/B cells of a campaign with a setting axis
(`campaigns/settings.toml`) as one picture. A row per pipeline and fix set, a column per setting and mode; each square
says what its A/B decided (the speed-up, where it decided a change), or that it is undecided (with its estimate so
far), settled otherwise (the fix's code never ran, its outputs differ) or not measured yet. Written by `lab table` as
`results/settings.png`, beside the table of the same cells.

`order` and `grid` lay the cells out and `mark` reads each one: pure functions over the campaign's states (objects with
`state`, `result` and a `cell` with `kind`, `pipeline`, `fixes`, `base`, `mode` and `option`), tested on literal
ones; `plot` only draws what they give."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.pages import figure
from lab.results.states import OWED, State
from lab.verdicts.verdict import Verdict

SETTINGS_PNG = "settings.png"

#: what each kind of square looks like: (face colour, text colour); a change's face is shaded by its size instead
STYLE = {"equivalent": ("#d9d9d9", "#333333"), "undecided": ("#fff0a8", "#5a4a00"), "settled": ("#c6dbef", "#08306b"),
         "planned": ("#ffffff", "#999999"), "failed": ("#fcbba1", "#67000d")}


@dataclass(frozen=True)
class Mark:
    """One square: its kind (`faster`, `slower`, `equivalent`, `undecided`, `settled`, `planned` or `failed`), the
    text it shows, and control/test where its A/B decided a change (the shading)."""
    kind: str
    text: str
    speedup: float | None = None


def _times(speedup: float) -> str:
    """A speed-up as the square shows it (`5.6x`, `1.03x`): a change of a few percent keeps its second decimal."""
    return f"{speedup:.2f}x" if speedup < 1.1 else f"{speedup:.1f}x"


def mark(state: State, verdict: Verdict | None, ratio: float | None) -> Mark:
    """A cell's square from its campaign state and, where it has a result, that result's verdict and test/control
    ratio (the Hodges-Lehmann estimate). Undecided cells show their estimate so far with a question mark: a set
    whose 7 blocks say 0.15 is not the same open question as a fix at 0.99."""
    if state == State.FAILED:
        return Mark("failed", "failed")
    if state in OWED:  # planned, or measured in a way that is owed again (an old build)
        return Mark("planned", "·")
    if verdict in (Verdict.FASTER, Verdict.SLOWER) and ratio:
        return Mark(verdict.value, _times(1 / ratio), 1 / ratio)
    if verdict is Verdict.EQUIVALENT:
        return Mark("equivalent", "≈")
    if verdict is Verdict.BOUNDED:  # equivalent, decided by the trace's bound
        return Mark("equivalent", "≈ (trace)")
    if verdict is Verdict.NOT_EXERCISED:
        return Mark("settled", "not run")
    if verdict is Verdict.OUTPUTS_DIFFER:
        return Mark("settled", "differ")
    return Mark("undecided", f"{_times(1 / ratio)}?" if ratio else "?")


@dataclass
class Grid:
    rows: list[tuple[str, str]] = field(default_factory=list)  # (pipeline with its depth, fix set)
    columns: list[tuple[str, str]] = field(default_factory=list)  # (setting, mode)
    marks: dict[tuple[tuple[str, str], tuple[str, str]], Mark] = field(default_factory=dict)


def row_of(cell) -> tuple[str, str]:
    """A cell's row: its pipeline (with the transformer blocks it runs at) and what it times: "all together" for a
    set of several fixes (each setting's own set: the fixes that apply there), the fix for one, and "... over BASE"
    for fixes timed with others on in both arms (`base`)."""
    depth = f" ({cell.option('layers')} blocks)" if cell.option("layers") else ""
    fixes = "all together" if len(cell.fixes) > 1 else cell.fixes[0]
    if cell.base:
        fixes = f"{'the others' if len(cell.fixes) > 1 else cell.fixes[0]} over {'+'.join(cell.base)}"
    return f"{cell.pipeline}{depth}", fixes


def column_of(cell) -> tuple[str, str]:
    setting = str(cell.option("setting") or "none") + (", decoding" if cell.option("full_decode") else "")
    return setting, cell.mode


def row_order(fixes: str) -> tuple:
    """In a pipeline: the set of all its fixes first, then each fix, then the fixes over a base."""
    return " over " in fixes, fixes != "all together", fixes


def order(states: Sequence) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The rows and columns of the campaign's A/B cells: pipelines (by name, then depth: FLUX.1 at all its blocks
    and at 8 stand together) and settings in the order the campaign lists them, in each pipeline the sets first,
    then each fix, then the fixes over a base (`row_order`); eager before compile."""
    cells = [s.cell for s in states if s.cell.kind == "ab"]
    pipelines = list(dict.fromkeys(c.pipeline for c in cells))
    name_of = {row_of(c)[0]: c.pipeline for c in cells}  # "flux (8 blocks)" -> "flux"
    depths = list(dict.fromkeys(name_of))
    settings = list(dict.fromkeys(column_of(c)[0] for c in cells))
    modes = ("eager", "compile")
    rows = sorted(dict.fromkeys(row_of(c) for c in cells),
                  key=lambda r: (pipelines.index(name_of[r[0]]), depths.index(r[0]), row_order(r[1])))
    columns = sorted(dict.fromkeys(column_of(c) for c in cells),
                     key=lambda c: (settings.index(c[0]), modes.index(c[1]) if c[1] in modes else len(modes)))
    return rows, columns


def grid(states: Sequence, read: Callable[[Path], tuple[Verdict, float | None]]) -> Grid:
    """The campaign's A/B cells laid out (`order`), each read into its square (`mark`). `read(path)` gives a
    result's verdict and ratio (`lab.results.read`, or literals in a test)."""
    rows, columns = order(states)
    out = Grid(rows, columns)
    for s in states:
        if s.cell.kind == "ab":
            verdict, ratio = read(s.result) if s.result is not None else (None, None)
            out.marks[row_of(s.cell), column_of(s.cell)] = mark(s.state, verdict, ratio)
    return out


#: the speed-up (or slow-down) whose square is shaded in full; a larger one is shaded the same
FULL_AT = 8.0


def _face(m: Mark) -> tuple[str, str]:
    """A change's square is shaded by its size on a log scale: a change of a percent pale, `FULL_AT` and more
    full."""
    if m.speedup is None:
        return STYLE[m.kind]
    import matplotlib

    share = min(1.0, abs(math.log(m.speedup)) / math.log(FULL_AT))
    cmap = matplotlib.colormaps["Greens" if m.kind == "faster" else "Reds"]
    rgba = cmap(0.25 + 0.7 * share)
    return matplotlib.colors.to_hex(rgba), ("white" if share > 0.45 else "black")


def plot(layout: Grid, path: Path, title: str) -> Path | None:
    """The grid as squares with their text; a line between pipelines and between settings."""
    if not layout.rows:
        return None
    key = figure.key(sys.modules[__name__], layout, title)
    if figure.current(path, key):
        return Path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows, n_cols = len(layout.rows), len(layout.columns)
    y_of = {row: i for i, row in enumerate(layout.rows)}
    x_of = {column: i for i, column in enumerate(layout.columns)}
    fig, ax = plt.subplots(figsize=(3.2 + 0.62 * n_cols, 2.0 + 0.24 * n_rows))
    for (row, column), m in layout.marks.items():
        y, x = y_of[row], x_of[column]
        face, ink = _face(m)
        ax.add_patch(plt.Rectangle((x - 0.47, y - 0.45), 0.94, 0.9, facecolor=face, edgecolor="#bbbbbb", lw=0.4,
                                   hatch="///" if m.kind == "undecided" else None))
        ax.text(x, y, m.text, ha="center", va="center", fontsize=5.5, color=ink)
    for i in range(1, n_rows):
        if layout.rows[i][0] != layout.rows[i - 1][0]:
            ax.axhline(i - 0.5, color="#555555", lw=0.8)
    for i in range(1, n_cols):
        if layout.columns[i][0] != layout.columns[i - 1][0]:
            ax.axvline(i - 0.5, color="#555555", lw=0.8)
    ax.set_xlim(-0.5, n_cols - 0.5)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_yticks(range(n_rows), [f"{pipeline} · {fixes}" for pipeline, fixes in layout.rows], fontsize=6)
    ax.set_xticks(range(n_cols), [f"{setting} · {mode}" for setting, mode in layout.columns], fontsize=6,
                  rotation=55, ha="left")
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    legend = [("faster: its speed-up (greener is larger)", _face(Mark("faster", "", 4.0))[0], None),
              ("slower: its speed-up, under 1x", _face(Mark("slower", "", 0.5))[0], None),
              ("equivalent within the margin (≈)", STYLE["equivalent"][0], None),
              ("undecided or too few blocks: its estimate so far, ?", STYLE["undecided"][0], "///"),
              ("settled otherwise: the fix's code did not run, or its outputs differ", STYLE["settled"][0], None),
              ("not measured yet (·)", STYLE["planned"][0], None)]
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=face, edgecolor="#bbbbbb", hatch=hatch)
               for _, face, hatch in legend]
    ax.legend(handles, [label for label, _, _ in legend], loc="upper center", ncol=2, fontsize=7,
              bbox_to_anchor=(0.5, 0), frameon=False)
    ax.set_title(title, fontsize=9, pad=70)
    return figure.save(fig, path, tight=True, key=key)

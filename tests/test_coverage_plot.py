"""The settings campaign's picture and table (`lab.pages.coverage_plot`, `lab.pages.table.settings_table`): each
cell's square read from its state and verdict, laid out by pipeline and setting, and the table in the same order."""

import dataclasses
import math
from pathlib import Path

import pytest

from lab.campaigns import campaign
from lab.pages import coverage_plot, table
from lab.pages.coverage_plot import Mark, mark
from lab.verdicts.verdict import Verdict
from tests.conftest import ROOT

#: a decided committed result: FLUX.1's compiled model-offload set on an H200 host, 5.64x (FINDINGS)
DECIDED = (ROOT / "results/ab/flux"
           / "hook_registry_cache+model_offload_keep_host+no_progress_bar__compile__full-model_cpu_offload__h200.json")


@pytest.mark.parametrize("state, verdict, ratio, expected", [
    ("measured", Verdict.FASTER, 0.1774, Mark("faster", "5.6x", 1 / 0.1774)),
    ("measured", Verdict.FASTER, 0.9699, Mark("faster", "1.03x", 1 / 0.9699)),  # a few percent keeps its decimals
    ("measured", Verdict.SLOWER, 1.6, Mark("slower", "0.62x", 1 / 1.6)),
    ("measured", Verdict.EQUIVALENT, 0.998, Mark("equivalent", "≈")),
    ("undecided", Verdict.UNDECIDED, 0.1543, Mark("undecided", "6.5x?")),  # a set one block short of a verdict
    ("undecided", Verdict.INSUFFICIENT, 0.9929, Mark("undecided", "1.01x?")),
    ("undecided", Verdict.INSUFFICIENT, None, Mark("undecided", "?")),  # profiles kept, no block yet
    ("measured", Verdict.NOT_EXERCISED, 1.0, Mark("settled", "not run")),
    ("measured", Verdict.OUTPUTS_DIFFER, None, Mark("settled", "differ")),
    ("planned", None, None, Mark("planned", "·")),
    ("old build", Verdict.FASTER, 0.9, Mark("planned", "·")),  # owed again: its blocks timed another build
    ("failed", None, None, Mark("failed", "failed")),
])
def test_each_square_says_what_its_cell_decided(state, verdict, ratio, expected):
    got = mark(state, verdict, ratio)
    assert (got.kind, got.text) == (expected.kind, expected.text)
    assert got.speedup == pytest.approx(expected.speedup) if expected.speedup else got.speedup is None


CAMPAIGN = """[campaign]
description = "two settings"
device = "cuda"
[defaults]
size = "full"
fix = "each"
mode = ["compile", "eager"]
[[cell]]
pipeline = "flux"
setting = "lora:rank=16"
[[cell]]
pipeline = "flux"
setting = "model_cpu_offload"
mode = "eager"
[[cell]]
pipeline = "flux"
setting = "model_cpu_offload"
mode = "eager"
base = "model_offload_keep_host"
fix = ["hook_registry_cache", "model_offload_pinned"]
[[cell]]
pipeline = "flux"
layers = 8
setting = "group_offload:block_level"
mode = "eager"
[[cell]]
pipeline = "wan"
layers = 4
setting = "lora:rank=16"
"""


@pytest.fixture
def settings_campaign(tmp_path):
    (tmp_path / "campaigns").mkdir()
    path = tmp_path / "campaigns" / "settings.toml"
    path.write_text(CAMPAIGN)
    plan = campaign.load(path)
    return path, plan, campaign.status(plan, tmp_path / "results")


def test_the_grid_orders_pipelines_settings_and_fix_sets_as_a_reader_looks_for_them(settings_campaign):
    _, _, states = settings_campaign
    rows, columns = coverage_plot.order(states)
    # pipelines in the file's order, FLUX.1 at 8 blocks beside FLUX.1 (not after Wan); in each, the set first, then
    # each fix, then the fixes over a base
    pipelines = list(dict.fromkeys(pipeline for pipeline, _ in rows))
    assert pipelines == ["flux", "flux (8 blocks)", "wan (4 blocks)"]
    flux = [fixes for pipeline, fixes in rows if pipeline == "flux"]
    over = ["hook_registry_cache over model_offload_keep_host", "model_offload_pinned over model_offload_keep_host"]
    assert flux[0] == "all together" and flux[-2:] == over
    assert set(flux[1:-2]) >= {"hook_registry_cache", "no_progress_bar", "model_offload_keep_host"}
    assert flux[1:-2] == sorted(flux[1:-2])
    # settings in the file's order, eager before compile although the file lists compile first
    assert columns[:2] == [("lora:rank=16", "eager"), ("lora:rank=16", "compile")]
    assert [setting for setting, _ in columns[2:]] == ["model_cpu_offload", "group_offload:block_level"]
    layout = coverage_plot.grid(states, read=lambda path: pytest.fail(f"nothing is measured: {path}"))
    assert len(layout.marks) == len(states) and {m.kind for m in layout.marks.values()} == {"planned"}


def test_a_measured_cell_is_read_from_its_result(settings_campaign):
    _, _, states = settings_campaign
    (first, *_) = [s for s in states if s.cell.mode == "eager" and len(s.cell.fixes) > 1 and not s.cell.base]
    measured = dataclasses.replace(first, state="measured", result=Path("flux-set.json"))
    layout = coverage_plot.grid([measured], read={Path("flux-set.json"): (Verdict.FASTER, 0.25)}.get)
    assert layout.marks == {(("flux", "all together"), ("lora:rank=16", "eager")): Mark("faster", "4.0x", 4.0)}


def test_the_settings_table_lists_every_cell_in_the_pictures_order(settings_campaign):
    path, plan, states = settings_campaign
    (compiled,) = [s for s in states if s.cell.pipeline == "flux" and s.cell.mode == "compile"
                   and s.cell.fixes == ("hook_registry_cache", "no_progress_bar")]
    states = [dataclasses.replace(compiled, state="measured", result=DECIDED) if s is compiled else s for s in states]
    lines = table.settings_table(ROOT / "results", [(path, plan, states)])
    assert lines[0] == "## Coverage in the settings users run"
    assert f"![each fix set in each setting users run, by what its A/B decided]({coverage_plot.SETTINGS_PNG})" in lines
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| setting")]
    assert len(rows) == len({(coverage_plot.column_of(s.cell)[0], coverage_plot.row_of(s.cell)) for s in states})
    assert rows[0].startswith("| lora:rank=16 | flux | all together | *planned* | [faster 0.177](ab/flux/"
                              "hook_registry_cache+model_offload_keep_host+no_progress_bar__compile__full-model_cpu_"
                              "offload__h200.md) (4 steps, 8 blocks) |")
    assert rows[-1].startswith("| group_offload:block_level | flux (8 blocks) | ")
    assert "| model_cpu_offload | flux | model_offload_pinned over model_offload_keep_host | *planned* |  |" in lines
    # no settings campaign, no section
    assert table.settings_table(ROOT / "results", [(path.with_name("coverage.toml"), plan, states)]) == []


def test_the_picture_is_drawn_with_a_square_per_cell(settings_campaign, tmp_path):
    _, _, states = settings_campaign
    layout = coverage_plot.grid(states, read=lambda path: (Verdict.FASTER, 0.5))
    out = coverage_plot.plot(layout, tmp_path / "settings.png", "two settings")
    from PIL import Image

    with Image.open(out) as image:
        width, height = image.size
    assert width > 400 and height > 300 and height > width / 3  # a row per fix set: taller than a line
    assert coverage_plot.plot(coverage_plot.Grid(), tmp_path / "none.png", "none") is None


def test_the_shading_grows_with_the_change():
    pale, _ = coverage_plot._face(Mark("faster", "", 1.02))
    full, ink = coverage_plot._face(Mark("faster", "", 16.0))

    def green_depth(hex_colour: str) -> float:
        r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        return math.fsum((255 - r, 255 - g, 255 - b))

    assert green_depth(full) > green_depth(pale) and ink == "white"

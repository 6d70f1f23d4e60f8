"""A plot drawn from many results is drawn again only when what it shows changed (`lab.pages.figure.key`,
`current`): `lab table` spends most of its time drawing, and a kept plot is byte for byte the one it would draw."""

import json
from pathlib import Path

import pytest

from lab.pages import figure, report
from lab.results import schema

ROOT = Path(__file__).resolve().parents[1]
DECIDED = ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json"


def _items(**stats):
    data = json.loads(DECIDED.read_text())
    data["stats"].update(stats)
    return [("wan · unipc_host_coeffs", schema.load(data))]


def test_a_plot_is_kept_while_what_it_shows_is_the_same(tmp_path, monkeypatch):
    path = tmp_path / "effects.png"
    assert report.forest_plot(_items(), path) == path
    drawn = path.read_bytes()
    assert figure.key_path(path).exists()

    def never(*args, **kwargs):
        raise AssertionError("drawn again although nothing it shows changed")

    with monkeypatch.context() as m:
        m.setattr(figure, "save", never)
        assert report.forest_plot(_items(), path) == path  # the same values: kept
        with pytest.raises(AssertionError, match="drawn again"):
            report.forest_plot(_items(ratio=0.995), path)  # another estimate: drawn again
    path.write_bytes(drawn[:-10])  # a PNG that is not the one its key names (damaged, or edited by hand)
    report.forest_plot(_items(), path)
    assert path.read_bytes() == drawn  # drawn again, to the same bytes


def test_a_key_tells_apart_what_draws_differently():
    assert figure.key([1.0, "a"]) == figure.key([1.0, "a"])
    assert figure.key([1.0]) != figure.key([1.0000000000000002])
    assert figure.key([float("inf")]) != figure.key([float("nan")])
    assert figure.key(report.forest_plot, [1.0]) != figure.key(report.plot, [1.0])  # the code that draws, too
    with pytest.raises(TypeError):
        figure.key(object())


def test_without_a_key_nothing_is_written_beside_the_plot(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    figure.save(fig, tmp_path / "plot.png")
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]

"""A stored result whose numbers contradict themselves is refused by file and field as it is read
(`lab.results.check`, `lab.results.store`): never published by `lab table`, never decided again by `--restat`, never
gone on from by `lab ab --resume`, never the internal-error line. Each case is a literal tampered copy of a committed
result."""

import json
import shutil
from pathlib import Path

import pytest

from lab.results import schema, store
from lab.results.check import check_result

ROOT = Path(__file__).resolve().parents[1]
DECIDED = ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json"  # faster, sequential, 8 blocks
RESUMABLE = ROOT / "results/ab/chroma/begin_index+chroma_guidance_device+hook_registry_cache+no_progress_bar__eager__full__h200.json"

TAMPERED = {
    "a call time of zero": (lambda d: d["samples"]["control"]["wall_ms"].__setitem__(2, 0.0),
                            "samples.control.wall_ms[2] is 0.0"),
    "a negative call time": (lambda d: d["samples"]["test"]["raw_wall_ms"][1].__setitem__(0, -3.0),
                             "samples.test.raw_wall_ms[1][0] is -3.0"),
    "a step time that is not a number": (lambda d: d["samples"]["test"]["steps_ms"][0].__setitem__(1, float("nan")),
                                         "samples.test.steps_ms[0][1] is nan"),
    "one arm a block short": (lambda d: d["samples"]["test"]["wall_ms"].pop(), "the arms' blocks are paired"),
    "a ratio outside its own interval": (lambda d: d["stats"].__setitem__("ratio", 1.5),
                                         "stats.ratio 1.5 lies outside its own interval stats.ci"),
    "a reversed interval": (lambda d: d["stats"].__setitem__("ci", d["stats"]["ci"][::-1]),
                            "stats.ci [0.997225, 0.98975] is reversed"),
    "more blocks than its design allows": (lambda d: d["design"].__setitem__("max_blocks", 7),
                                           "samples hold 8 blocks, more than its design's max_blocks 7"),
    "faster with an interval that holds 1": (lambda d: d["stats"].update(ci=[0.99, 1.01]),
                                             "verdict \"faster\" but stats.ci [0.99, 1.01] reaches above 1"),
    "equivalent where the interval says faster": (lambda d: d.update(verdict="equivalent"),
                                                  "verdict \"equivalent\" but stats.ci [0.98975, 0.997225] decides it faster"),
    "equivalent outside the margin": (lambda d: (d.update(verdict="equivalent"),
                                                 d["stats"].update(ci=[0.97, 1.03], ci_equivalence=[0.98, 1.02])),
                                      "verdict \"equivalent within ±1%\" but stats.ci_equivalence [0.98, 1.02]"),
    "undecided where the interval decides": (lambda d: d.update(verdict="undecided"),
                                             "verdict \"undecided\" but stats.ci"),
}


def tampered(folder: Path, source: Path, edit) -> Path:
    """A copy of the committed result `source` under `folder/ab/<pipeline>/`, edited by `edit` (its parsed JSON)."""
    data = json.loads(source.read_text())
    edit(data)
    path = folder / "ab" / source.parent.name / source.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def test_every_committed_result_holds_together():
    for path in sorted((ROOT / "results").glob("**/*.json")):
        data = json.loads(path.read_text())
        if data.get("kind") in schema.TYPES and data.get("format") in store.READABLE:
            assert check_result(schema.load(data)) == [], path


@pytest.mark.parametrize("edit, field", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_result_that_contradicts_itself_is_refused_by_file_and_field(tmp_path, edit, field):
    path = tampered(tmp_path, DECIDED, edit)
    with pytest.raises(store.Refused) as e:
        store.read(path)
    assert str(path) in str(e.value) and field in str(e.value), str(e.value)
    assert e.value.exit_code == 2  # bad input
    with pytest.raises(store.Refused):
        store.all_results(tmp_path / "ab")


def test_lab_table_leaves_a_refused_result_out_says_so_and_writes_the_rest(tmp_path, capsys):
    from lab import cli

    results = tmp_path / "results"
    good = tampered(results, RESUMABLE, lambda d: None)
    bad = tampered(results, DECIDED, lambda d: d["stats"].__setitem__("ratio", 1.5))
    bad.with_suffix(".md").write_text("the page as it was\n")
    code = cli.main(["table", "--results", str(results)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"WARNING: {bad}: refused" in err and "stats.ratio 1.5" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ERROR: 1 result file(s) refused")
    readme = (results / "README.md").read_text()
    assert good.stem in readme and bad.stem not in readme and "1.5" not in readme
    assert good.with_suffix(".md").exists() and bad.with_suffix(".md").read_text() == "the page as it was\n"


def test_restat_refuses_a_time_of_zero_before_rewriting_anything(tmp_path, capsys):
    from lab import cli

    results = tmp_path / "results"
    good = tampered(results, RESUMABLE, lambda d: None)
    before = good.read_text()
    bad = tampered(results, DECIDED, lambda d: d["samples"]["control"]["wall_ms"].__setitem__(2, 0.0))
    code = cli.main(["table", "--restat", "--results", str(results)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"ERROR: nothing decided again: {bad}: refused") and "samples.control.wall_ms[2] is 0.0" in err
    assert "Full traceback" not in err and good.read_text() == before and not (results / "README.md").exists()


def test_a_refused_result_is_never_gone_on_from(tmp_path):
    from lab.measure import cell

    stored = tampered(tmp_path, RESUMABLE, lambda d: d["samples"]["control"]["wall_ms"].__setitem__(2, -1.0))
    plan = cell.plan({"json": stored}, replace=False, resume=True)
    assert not plan.run and str(stored) in plan.note and "samples.control.wall_ms[2] is -1.0" in plan.note
    assert "--replace" in plan.note


def test_inside_one_reading_a_file_is_read_once_and_again_once_written(tmp_path):
    path = tampered(tmp_path, DECIDED, lambda d: None)
    with store.one_reading():
        first = store.read(path)
        assert store.read(path) is first and store.all_results(tmp_path / "ab")[0][1] is first
        shutil.copyfile(RESUMABLE, path)  # written again: another size and time
        assert store.read(path).name == RESUMABLE.stem
    assert store.read(path) is not store.read(path)  # outside it, every read reads the file


def test_a_campaign_cell_whose_result_is_refused_reads_as_not_measured_in_lab_table(tmp_path):
    from lab.campaigns import campaign

    plan = tmp_path / "c.toml"
    plan.write_text("[campaign]\ndevice = 'cpu'\n[[cell]]\npipeline = 'wan'\nfix = 'unipc_stack'\nsize = 'tiny'\n")
    bad = tmp_path / "results" / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    bad.parent.mkdir(parents=True)
    data = json.loads(DECIDED.read_text())
    data["samples"]["test"]["wall_ms"][0] = 0.0
    bad.write_text(json.dumps(data))
    from lab.base.errors import UsageError

    with pytest.raises(UsageError, match="samples.test.wall_ms\\[0\\] is 0.0"):  # `lab campaign plan`: bad input
        campaign.status(campaign.load(plan), tmp_path / "results")
    with store.one_reading():  # `lab table`, which has named it in a warning
        store.leave_out([bad])
        [state] = campaign.status(campaign.load(plan), tmp_path / "results")
    assert state.state == "planned" and state.result is None

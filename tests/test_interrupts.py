"""A Ctrl-C is a Ctrl-C wherever it lands: the command exits 130, and nothing records it as a failure of what it
interrupted."""

from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import TransformExit, VisitorBasedCodemodCommand

from lab import cli
from lab.apply import rewrite


class Interrupted(VisitorBasedCodemodCommand):
    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        raise KeyboardInterrupt  # what a Ctrl-C during a rewrite is; libcst turns it into a TransformExit


def test_a_ctrl_c_inside_a_libcst_rewrite_stays_a_ctrl_c():
    with pytest.raises(KeyboardInterrupt):
        rewrite.rewrite_source("x = 1\n", [Interrupted], "m.py")


def test_a_command_interrupted_in_a_rewrite_exits_130(monkeypatch, capsys, tmp_path):
    from lab.apply import fix

    monkeypatch.setenv("LAB_CACHE", str(tmp_path))  # nothing stored: the rewrite runs
    fix.rewrite.cache_clear()
    monkeypatch.setattr(rewrite, "_transform", lambda *args, **kwargs: TransformExit())
    assert cli.main(["diff", "--fix", "unipc_device_const"]) == 130
    fix.rewrite.cache_clear()
    assert "Interrupted." in capsys.readouterr().err


def test_an_interrupted_write_keeps_the_earlier_file(tmp_path):
    from lab.base import files

    trace = tmp_path / "wan_eager.json.gz"
    trace.write_bytes(b"the earlier good trace")
    with pytest.raises(KeyboardInterrupt), files.whole(trace) as tmp:
        tmp.write_bytes(b"half a tr")
        raise KeyboardInterrupt
    assert trace.read_bytes() == b"the earlier good trace" and sorted(tmp_path.iterdir()) == [trace]
    files.write_text(trace, "new")
    assert trace.read_text() == "new" and sorted(tmp_path.iterdir()) == [trace]
    plain = tmp_path / "plain"
    plain.write_text("")
    assert trace.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkstemp's 0600


def test_a_profile_interrupted_during_the_export_keeps_the_earlier_trace(tmp_path, monkeypatch):
    import torch

    from lab.run.profile import ProfileOptions, profile_call
    from lab.run.scenario import build, get_scenario

    built = build(get_scenario("wan"), size="tiny", device="cpu")
    trace = tmp_path / "wan_eager.json.gz"
    trace.write_bytes(b"the earlier good trace")

    def export(self, path):
        with open(path, "wb") as f:
            f.write(b"\x1f\x8b half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", export)
    with pytest.raises(KeyboardInterrupt):
        profile_call(built, tmp_path, "wan_eager", ProfileOptions(record_shapes=False))
    assert trace.read_bytes() == b"the earlier good trace" and sorted(tmp_path.iterdir()) == [trace]
    # not interrupted: the new trace replaces it, gzipped whole (`export_trace`), and nothing else is left beside it
    monkeypatch.undo()
    from lab.traces.trace import load

    assert profile_call(built, tmp_path, "wan_eager", ProfileOptions(record_shapes=False))["trace"] == trace
    assert sorted(tmp_path.iterdir()) == [trace] and load(trace).by_cat


def test_a_write_killed_midway_leaves_a_hidden_partial_that_no_reader_takes_for_a_result(tmp_path):
    """SIGKILL cannot be caught: the temporary file of a result being written stays. Every reader that globs a
    folder for results passes over it (`files.written`), so `lab table`, a campaign's plan and `--restat` go on."""
    import shutil

    from lab.base import files
    from lab.results import store
    from lab.results.restat import restat

    folder = tmp_path / "ab" / "wan"
    folder.mkdir(parents=True)
    name = "model_offload_pinned__eager__full-4l-model_cpu_offload__h200.json"
    kept = folder / name
    shutil.copy(Path(__file__).resolve().parents[1] / "results" / "ab" / "wan" / name, kept)
    partial = folder / f".{name}.k1ll3d.partial.json"
    partial.write_text('{"kind": "ab", "half')  # what a killed write leaves
    assert files.written(sorted(folder.glob("*.json"))) == [kept]
    assert [p for p, _ in store.all_results(tmp_path / "ab")] == [kept]
    restat(tmp_path)  # reads every result under the folder: the partial would be a parse error

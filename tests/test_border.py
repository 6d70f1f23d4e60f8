"""The borders of every command: bad input refused before anything is built (one `ERROR:` line, exit code 2),
nothing written outside `--out`, one writer per result, a full disk said as one, and an interruption that names what
it kept and what it did not do."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.base import files, outputs
from lab.base.errors import UsageError
from tests.conftest import ROOT, ctrl_c_at, lab_here

CAMPAIGN = '[campaign]\ndescription = "border"\ndevice = "cpu"\n\n[[cell]]\npipeline = "wan"\nfix = "no_progress_bar"\n'

#: each command that writes results, as a user starts it on a tiny scenario, with where its output goes (OUT)
COMMANDS = {
    "ab": ["ab", "--fix", "no_progress_bar", "--pipeline", "PIPE", "--out", "OUT"],
    "profile": ["profile", "--pipeline", "PIPE", "--out", "OUT"],
    "census": ["census", "--pipeline", "PIPE", "--out", "OUT"],
    "sweep": ["sweep", "--fix", "no_progress_bar", "--pipeline", "PIPE", "--vary", "batch=1,2", "--out", "OUT"],
    "hunt": ["hunt", "--pipeline", "PIPE", "--out", "OUT"],
    "calibrate": ["calibrate", "--pipeline", "PIPE", "--out", "OUT"],
    "history": ["history", "--pipeline", "PIPE", "--diffusers", "0.37.1,0.38.0", "--out", "OUT"],
    "run": ["run", "--pipeline", "PIPE", "--json", "OUT/run.json"],
    "campaign": ["campaign", "run", "CAMPAIGN", "--results", "OUT"],
}
#: the bad inputs every command takes the same way: how each is given
MISTAKES = {
    "a missing scenario": {"PIPE": "wna"},
    "a bad setting value": {"SETTING": "first_block_cache:threshold=-1"},
    "an --out that is a file": {"OUT": "FILE"},
    "an --out under a file": {"OUT": "FILE/results"},
    "an --out of too long a name": {"OUT": "x" * 300},
}


def _argv(command: str, mistake: str, tmp_path: Path) -> list[str]:
    given = MISTAKES[mistake]
    (tmp_path / "file").write_text("a file where a folder belongs")
    campaign = tmp_path / "border.toml"
    setting = given.get("SETTING")
    campaign.write_text(CAMPAIGN + (f'setting = "{setting}"\n' if setting else ""))
    out = given.get("OUT", str(tmp_path / "out")).replace("FILE", str(tmp_path / "file"))
    if not out.startswith("/"):
        out = str(tmp_path / out)
    argv = [a.replace("PIPE", given.get("PIPE", "wan")).replace("OUT", out).replace("CAMPAIGN", str(campaign))
            for a in COMMANDS[command]]
    if setting and command != "campaign":
        argv += ["--setting", setting]
    return argv


# every command with every mistake, but a campaign's missing scenario: its file names its scenarios, and
# `tests/test_campaign.py` refuses an unknown one there
CASES = [(c, m) for c in COMMANDS for m in MISTAKES if (c, m) != ("campaign", "a missing scenario")]


@pytest.mark.parametrize(("command", "mistake"), CASES)
def test_each_commands_bad_input_is_one_line_exit_2_before_anything_is_built(command, mistake, tmp_path, monkeypatch):
    from lab.run import scenario

    def built(*args, **kwargs):
        raise AssertionError("built before the bad input was refused")

    monkeypatch.setattr(scenario, "build", built)
    monkeypatch.chdir(tmp_path)  # nothing may land in the repository
    proc = lab_here(*_argv(command, mistake, tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines and lines[-1].startswith("ERROR: ") and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "built before" not in proc.stderr
    said = {"a missing scenario": "wna", "a bad setting value": "[0, inf)", "an --out that is a file": "is a file",
            "an --out under a file": "is a file", "an --out of too long a name": "too long"}[mistake]
    assert said in lines[-1], lines[-1]
    assert not list(tmp_path.glob("**/.*.lock")), "a refused command leaves no claim behind"


@pytest.mark.parametrize("command", ["ab", "sweep", "hunt", "calibrate", "history"])
@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden"])
def test_a_name_that_would_leave_out_is_refused(command, name, tmp_path, monkeypatch):
    from lab.run import scenario

    monkeypatch.setattr(scenario, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    monkeypatch.chdir(tmp_path)
    proc = lab_here(*[a.replace("PIPE", "wan").replace("OUT", str(tmp_path / "out")) for a in COMMANDS[command]],
                    "--name", name)
    assert proc.returncode == 2 and "a result name is one file name" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path.parent / "x.json").exists() and not list(tmp_path.parent.glob("x.*"))


def test_the_output_check(tmp_path, monkeypatch):
    out = tmp_path / "new" / "deeper"
    assert outputs.check(out, ["wan/x.json"]) == out and not (tmp_path / "new").exists()  # creatable: nothing made
    assert not list(tmp_path.iterdir()), "the probe leaves nothing behind"
    with pytest.raises(UsageError, match="outside it"):
        outputs.check(tmp_path, ["../x.json"])
    with pytest.raises(UsageError, match="too long"):
        outputs.check(tmp_path, ["x" * 240 + ".json"])  # fits alone, not with the temporary name beside it
    outputs.check(tmp_path, ["x" * 200 + ".json"])
    from lab.base import outputs as module

    monkeypatch.setattr(module.shutil, "disk_usage", lambda p: type("U", (), {"free": 10 * 2**20})())
    with pytest.raises(UsageError, match=r"only 10\.0 MB free .* at least 50 MB"):
        outputs.check(tmp_path)


@pytest.mark.skipif(sys.platform != "linux" or __import__("os").geteuid() == 0,
                    reason="root writes in a read-only folder: the probe finds that out, the mode bits do not")
def test_a_read_only_out_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="cannot write in"):
            outputs.check(folder / "ab", ["wan/x.json"])
    finally:
        folder.chmod(0o755)


def test_settings_take_only_what_diffusers_takes():
    from lab.run import settings

    refused = {
        "first_block_cache:threshold=-1": "`threshold` takes a finite float in [0, inf)",
        "first_block_cache:threshold=nan": "not `nan`",
        "first_block_cache:threshold=inf": "not `inf`",
        "pyramid_attention_broadcast:skip_range=-3": "`skip_range` takes a finite int in [1, inf)",
        "taylorseer_cache:interval=0": "`interval` takes a finite int in [1, inf)",
        "lora:scale=nan": "`scale` takes a finite float in (-inf, inf)",
        "lora:rank=0": "in [1, inf)",
        "mag_cache:retention=1.5": "in [0, 1]",
        "faster_cache:weight=-0.1": "in [0, 1]",
        "group_offload:blocks=0": "in [1, inf)",
        "first_block_cache:threshold=0.1,threshold=0.2": "`threshold` is given twice (`threshold=0.1`, "
                                                         "`threshold=0.2`)",
        "group_offload:leaf_level,block_level": "`level` is given twice",
    }
    for text, says in refused.items():
        with pytest.raises(UsageError, match=None) as e:
            settings.parse(text)
        assert says in str(e.value) and f"`--setting {text}`" in str(e.value), str(e.value)
    assert settings.parse("first_block_cache:threshold=0").options["threshold"] == 0
    assert settings.parse("lora:scale=-1,fused").options["scale"] == -1.0  # a negative LoRA scale is a user's own


def test_a_campaign_plans_no_cell_of_a_setting_out_of_range(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CAMPAIGN + 'setting = "taylorseer_cache:interval=0"\n')
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path / "results"))
    assert proc.returncode == 2 and "`interval` takes a finite int in [1, inf)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("tolerance", ["nan", "-1", "inf"])
def test_a_tolerance_is_a_finite_number_of_zero_or_more(tolerance, tmp_path):
    proc = lab_here("ab", "--patch", "x.diff", "--pipeline", "wan", f"--tolerance={tolerance}", "--out",
                    str(tmp_path))
    assert proc.returncode == 2 and "`--tolerance" in proc.stderr and "finite number" in proc.stderr, proc.stderr


# --- one writer per result -----------------------------------------------------------------------------------------

HOLD = """
import sys, time
from lab.base import files
files.claim(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def _held(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_of_a_result_is_refused_at_its_start(tmp_path, monkeypatch):
    from lab.run import scenario

    monkeypatch.setattr(scenario, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    result = tmp_path / "ab" / "wan" / "no_progress_bar__eager__tiny__cpu.json"
    holder = _held(result)
    try:
        proc = lab_here("ab", "--fix", "no_progress_bar", "--pipeline", "wan", "--size", "tiny", "--device", "cpu",
                        "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces"))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{result} is being written by another lab (process {holder.pid}, `lab" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        with pytest.raises(Exception, match="is being written by another lab"):  # the writer refuses it too
            files.write_text(result, "{}")
        assert not result.exists()
    finally:
        holder.kill()
        holder.wait()
    files.claim(result)  # a holder killed outright holds nothing: the kernel let go of its lock
    files.write_text(result, "{}")
    files.release(result)
    assert sorted(p.name for p in result.parent.iterdir()) == [result.name]  # no lock file left


# --- a full disk -----------------------------------------------------------------------------------------------------


def test_a_full_disk_while_the_trace_is_exported_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    """torch's exporter writes `<raw>.tmp` and renames it; on a full disk it logs the failed write, raises nothing and
    leaves the temporary file: the lab says "no space left on device" and removes it."""
    import torch

    from lab import cli
    from lab.run import profile

    def full_disk(self, path):  # what kineto does when its write fails midway (a real 64 KiB tmpfs showed it)
        Path(path + ".tmp").write_bytes(b'{"traceEvents": [')

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", full_disk)
    monkeypatch.setattr(profile.shutil, "disk_usage", lambda p: type("U", (), {"free": 0})())
    out = tmp_path / "traces"
    with pytest.raises(OSError) as e:
        profile.export_trace(torch.profiler.profile(), out / "wan_eager.json.gz")
    assert e.value.errno == errno.ENOSPC
    assert "no space left on device" in cli.os_error(e.value) and str(out / "wan_eager.json.gz") in cli.os_error(e.value)
    assert not list(out.iterdir()), "neither torch's temporary file nor the lab's is left"


# --- interruptions -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_interrupted_sweep_exits_130_and_names_what_it_kept_and_did_not_measure(tmp_path, monkeypatch, capsys):
    from lab import cli

    ctrl_c_at(monkeypatch, 8)  # in the first point's blocks
    code = cli.main(["sweep", "--fix", "unipc_stack", "--pipeline", "wan", "--vary", "batch=1,2", "--blocks", "6",
                     "--repeat", "1", "--no-profile", "--out", str(tmp_path / "sweep"), "--trace-dir",
                     str(tmp_path / "traces")])
    err = capsys.readouterr().err
    assert code == 130, err[-2000:]
    assert "the complete blocks of batch = 1" in err and "not measured: batch = 2" in err, err[-2000:]
    saved = json.loads((tmp_path / "sweep" / "wan" / "unipc_stack__batch__eager__tiny__cpu.json").read_text())
    assert [p["value"] for p in saved["points"]] == [1] and saved["points"][0]["interrupted"]


@pytest.mark.slow
def test_an_interrupted_census_replace_keeps_the_complete_census(tmp_path, monkeypatch, capsys):
    """`--replace` cut short keeps the complete census it was to replace (as `lab ab` and `lab sweep` do): this run's
    arms go beside the traces, and the message names what was kept and what was not measured."""
    from lab import cli
    from lab.measure import census

    argv = ["census", "--pipeline", "wan,flux", "--arms", "ends", "--out", str(tmp_path / "census"), "--trace-dir",
            str(tmp_path / "traces")]
    assert cli.main(argv[:2] + ["wan"] + argv[3:]) == 0
    path = tmp_path / "census" / "wan__eager__tiny__cpu.json"
    before = path.read_text()
    real, calls = census.measure_arm, []

    def second_arm_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(census, "measure_arm", second_arm_interrupted)
    capsys.readouterr()
    assert cli.main(argv + ["--replace"]) == 130
    err = capsys.readouterr().err
    assert path.read_text() == before  # the complete census stays
    aside = json.loads((tmp_path / "traces" / "interrupted" / "census" / path.name).read_text())
    assert aside["error"] == "interrupted" and len(aside["arms"]) == 1
    assert "wan: kept its 1 complete arm(s)" in err and "not measured: flux" in err, err[-2000:]
    assert not list((tmp_path / "census").glob(".*.lock"))


# --- going on from a change given as diffs, and a wheel of another package ---------------------------------------


def test_resume_compares_diffs_by_content_and_says_why_in_words():
    from lab.measure.cell import _same_diffs, _shown, _without_diffs

    a = {"paths": ["/tmp/a/change.diff"], "sha256": "ab" * 32, "skipped": [], "modules": {"diffusers.x": ["f"]}}
    b = {**a, "paths": ["./elsewhere/mine.diff"]}
    assert _same_diffs(a, b) and _without_diffs("patches", a) == _without_diffs("patches", b)
    assert _without_diffs("fixes", ["patch-change", "no_progress_bar"]) == ["no_progress_bar"]
    other = {**a, "sha256": "cd" * 32}
    assert not _same_diffs(a, other)
    assert _shown("patches", a) == "the diff(s) /tmp/a/change.diff (sha256 abababababab; changing diffusers.x)"
    assert "{" not in _shown("patches", other)


@pytest.mark.slow
def test_resume_of_a_patch_run_takes_the_same_diff_from_another_path(tmp_path, monkeypatch, capsys):
    import shutil

    from lab import cli
    from lab.measure import ab

    diffs = [tmp_path / where / "unipc_stack.diff" for where in ("first", "second", "changed")]
    for diff in diffs:
        diff.parent.mkdir()
        shutil.copy(ROOT / "patches" / "unipc_stack.diff", diff)
    diffs[2].write_text("# another header line\n" + diffs[2].read_text())  # other bytes, the same change

    def argv(diff: Path) -> list[str]:
        return ["ab", "--patch", str(diff), "--pipeline", "wan", "--repeat", "1", "--max-blocks", "8", "--no-profile",
                "--out", str(tmp_path / "ab"), "--trace-dir", str(tmp_path / "traces")]

    real = ctrl_c_at(monkeypatch, 17)  # in the third block or so
    assert cli.main(argv(diffs[0])) == 130
    monkeypatch.setattr(ab, "timed_call", real)
    capsys.readouterr()
    changed = lab_here(*argv(diffs[2]), "--resume")
    assert changed.returncode == 2 and "patches was the diff(s) " in changed.stderr, changed.stderr[-2000:]
    assert "{'paths'" not in changed.stderr and "sha256 " in changed.stderr
    assert cli.main([*argv(diffs[1]), "--resume"]) in (0, 1)  # the same diff by another path goes on
    assert "going on from" in capsys.readouterr().err


def test_a_wheel_of_another_package_is_one_error_and_leaves_no_folder(tmp_path, monkeypatch):
    import zipfile

    from lab.apply import releases

    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "diffusers-0.99.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("requests/__init__.py", "")
        z.writestr("requests-2.0.dist-info/METADATA", "")
    with pytest.raises(UsageError, match=r"holds no diffusers package .*its packages: requests\)"):
        releases.resolve(str(wheel))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))
    proc = lab_here("census", "--pipeline", "wan", "--diffusers", str(wheel), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "holds no diffusers package" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

"""Campaigns as data: expanding a campaign file, planning it, running it (one after another, resumed after a kill,
and two jobs at once on a local Dask cluster)."""

import importlib.util
import inspect
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.apply.fix import each_sets
from lab.base.errors import UsageError
from lab.campaigns import campaign, cluster
from lab.verdicts import stats
from tests.conftest import ROOT, lab_forked, lab_here

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow

TINY = ROOT / "tests" / "data" / "campaign_tiny.toml"
DATA = ROOT / "tests" / "data" / "results"  # results as they were when a test was written



def test_a_campaign_file_expands_into_cells_and_jobs():
    plan = campaign.load(TINY)
    assert plan.device == "cpu" and plan.name == "campaign_tiny"
    assert [(c.pipeline, c.fixes) for c in plan.cells] == [
        ("flux", ("hook_registry_cache",)), ("flux", ("no_progress_bar",)),
        ("flux", ("hook_registry_cache", "no_progress_bar")), ("qwenimage_zero_cond", ("qwen_modulate_index",))]
    jobs = campaign.jobs(list(plan.cells))
    assert [len(j.cells) for j in jobs] == [3, 1]  # the three flux sets share one build
    argv = jobs[0].argv(Path("res"))
    assert argv[1:5] == ["-m", "lab.cli", "ab", "--pipeline"] and argv.count("--fix") == 3
    # the set of several fixes leads its job (where a time limit ends it, that is the cell measured), then the file's
    # order
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--fix"] == [
        "hook_registry_cache,no_progress_bar", "hook_registry_cache", "no_progress_bar"]
    assert "--no-profile" in argv and argv[argv.index("--blocks") + 1] == "6" and argv[argv.index("--out") + 1] == "res/ab"
    assert plan.cells[0].stem("cpu") == "hook_registry_cache__eager__tiny__cpu"


def test_a_step_count_other_than_the_default_is_in_the_name():
    # a 2-step run and the 4-step coverage cell once shared a name, and the second replaced the first
    from lab.base import naming

    assert naming.size_tag("full", None, steps=4) == naming.size_tag("full", None) == "full"
    assert naming.size_tag("full", 8, steps=2) == "full-8l-2steps"
    assert naming.size_tag("full", 2, settings=("lora",), diffusers="0.42.1") == "full-2l-lora-diffusers0.42.1"
    plan = campaign.load(ROOT / "campaigns" / "h200-parts-1-32.toml")
    two = [c for c in plan.cells if c.option("steps") == 2]
    assert two and all(c.stem("h200").endswith("__full-2steps__h200") for c in two)


def test_a_decoding_call_is_in_the_name_and_the_result(tmp_path):
    """A user's call decodes (`--full-decode`); the lab's default returns latents. The two once shared a name, so a
    decoding A/B would have been skipped as measured, or replaced the other."""
    from lab import cli
    from lab.base import naming

    assert naming.size_tag("full", 8, decode=True, settings=("model_cpu_offload",)) == "full-8l-decode-model_cpu_offload"
    path = tmp_path / "d.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "flux"\nfix = "hook_registry_cache"\nfull_decode = true\n')
    cell = campaign.load(path).cells[0]
    assert cell.stem("cpu") == "hook_registry_cache__eager__full-decode__cpu" and "--full-decode" in cell.argv(Path("r"))
    assert cli.main(["ab", "--fix", "hook_registry_cache", "--pipeline", "flux", "--full-decode", "--blocks", "2",
                     "--repeat", "1", "--no-profile", "--out", str(tmp_path / "ab"),
                     "--trace-dir", str(tmp_path / "traces")]) == 0
    written = tmp_path / "ab" / "flux" / "hook_registry_cache__eager__tiny-decode__cpu"
    assert json.loads(written.with_suffix(".json").read_text())["decoded"] is True
    assert "· decoded to images or video ·" in written.with_suffix(".md").read_text().splitlines()[2]
    from lab import results
    from lab.pages.table import _setting

    assert _setting(results.read(written.with_suffix(".json")))[3].endswith(", 4 steps, decoding")  # its own table


def test_a_setting_is_an_axis_of_cells_and_part_of_their_names(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "qwenimage"\nfix = "no_progress_bar"\nlayers = 8\n'
                    'setting = ["first_block_cache:threshold=0.2", "lora:rank=8,fused"]\n')
    plan = campaign.load(path)
    assert [c.stem("h200") for c in plan.cells] == [
        "no_progress_bar__eager__full-8l-first_block_cache-threshold0.2__h200",
        "no_progress_bar__eager__full-8l-lora-rank8-fused__h200"]
    jobs = campaign.jobs(list(plan.cells))
    assert len(jobs) == 2 and len({j.id for j in jobs}) == 2  # a setting is its own build: its own job and log
    argv = jobs[0].argv(Path("res"))
    assert argv[argv.index("--setting") + 1] == "first_block_cache:threshold=0.2"
    assert "setting first_block_cache:threshold=0.2" in plan.cells[0].label
    path.write_text('[campaign]\n[[cell]]\npipeline = "wan"\nfix = "all"\nsetting = "first_block_cach"\n')
    with pytest.raises(UsageError, match="Unknown setting `first_block_cach`"):
        campaign.load(path)


def test_a_census_job_is_estimated_from_the_run_logs(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[defaults]\nkind = "census"\nsize = "full"\nlayers = 2\n[[cell]]\n'
                    'pipeline = ["wan", "flux"]\nsetting = ["lora:rank=16", "model_cpu_offload"]\n')
    jobs = {j.id: j for j in campaign.jobs(list(campaign.load(path).cells))}
    wan_lora, wan_offload = jobs["census-wan-eager-full-2l-lora-aa"], jobs["census-wan-eager-full-2l-model_cpu_offload-aa"]
    assert campaign.estimate(wan_lora, tmp_path).basis.startswith("guess")  # nothing run yet
    (tmp_path / "campaigns").mkdir()
    log = [{"job": wan_lora.id, "exit": 0, "seconds": 120.0}, {"job": wan_lora.id, "exit": 1, "seconds": 5.0},
           {"job": "census-wan-eager-full-2l-aa", "exit": 0, "seconds": 60.0},
           {"job": "census-wan_v2v-eager-full-2l-aa", "exit": 0, "seconds": 999.0}]
    (tmp_path / "campaigns" / "other.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log) + '{"cut')
    same = campaign.estimate(wan_lora, tmp_path)  # its own finished run; the failed one and a cut-off line left out
    assert same.seconds == 120.0 and same.basis.startswith("this job took 120 s")
    alike = campaign.estimate(wan_offload, tmp_path)  # the same pipeline and mode in other settings, not wan_v2v
    assert alike.seconds == 90.0 and alike.basis.startswith("other census jobs of wan eager took 90 s (median of 2")
    assert campaign.estimate(jobs["census-flux-eager-full-2l-lora-aa"], tmp_path).basis.startswith("guess")
    # the same setting with other options comes before the pipeline's other settings
    path.write_text('[campaign]\n[defaults]\nkind = "census"\nsize = "full"\nlayers = 2\n[[cell]]\n'
                    'pipeline = "wan"\nsetting = "group_offload:block_level,stream,record_stream"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    log.append({"job": "census-wan-eager-full-2l-group_offload-stream-aa", "exit": 0, "seconds": 200.0})
    (tmp_path / "campaigns" / "other.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    in_setting = campaign.estimate(job, tmp_path)
    assert in_setting.seconds == 200.0
    assert in_setting.basis.startswith("other census jobs of wan eager in group_offload took 200 s (median of 1")


def test_a_budget_that_cannot_reach_a_decision_is_named_before_the_job_runs(tmp_path, capsys):
    """From the call times of an A/B measured in the same setting (FLUX.1 in group offloading on an H100: its control
    arm's calls take 13.0 s, its test arm's, with `group_offload_keep_host`, 3.9 s): a cell of another fix runs both
    arms at the control's calls, 65 s a block, so 6 min of blocks stop before the rule's first decision (5 blocks of
    the 7 it needs), 8 min reach 7, enough to find the arms equivalent but not the 8 a change needs, and 9 min reach
    8; `lab campaign plan` says so. (The median of both arms' calls, 8.1 s, a call time no arm had, made 6 min look
    enough.)"""
    from lab import cli

    measured = ROOT / "results/ab/flux/group_offload_keep_host__eager__full-8l-group_offload__h100.json"
    (tmp_path / "ab" / "flux").mkdir(parents=True)
    (tmp_path / "ab" / "flux" / measured.name).write_bytes(measured.read_bytes())
    path = tmp_path / "c.toml"
    for budget, short in (("2m", True), ("6m", True), ("8m", True), ("9m", False)):
        path.write_text('[campaign]\n[[cell]]\npipeline = "flux"\nsize = "full"\nlayers = 8\nmode = "eager"\n'
                        f'setting = "group_offload:block_level"\nfix = "no_progress_bar"\nbudget = "{budget}"\n')
        (job,) = campaign.jobs(list(campaign.load(path).cells))
        estimate = campaign.estimate(job, tmp_path)
        assert estimate.basis.startswith("12,974 ms calls measured in group_offload_keep_host"), estimate.basis
        assert (estimate.warning is not None) == short, estimate
    path.write_text(path.read_text().replace('"9m"', '"2m"'))
    assert cli.main(["campaign", "plan", str(path), "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Warning: 1 job\(s\) cannot decide within their budget.*\n  ab-flux-eager-full-8l-group_offload-"
                     r"no_progress_bar: at \d+ s per block, a budget of 2 min stops after about \d block\(s\), fewer "
                     r"than the 7 the rule needs to decide anything", out), out


def test_a_calibration_that_stopped_before_its_trials_is_owed_and_goes_on_from_them(tmp_path):
    """A cross-process calibration cell finds the file `lab calibrate --isolate` wrote (`__processes`); stopped
    after 15 of its 40 trials it is planned, not measured, and its job goes on from those trials (`--resume`, afresh
    with `--replace` where it cannot)."""
    committed = ROOT / "results/calibration/wan__eager__tiny__h100__processes.json"
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / committed.name).write_bytes(committed.read_bytes())
    plan = campaign.load(ROOT / "campaigns" / "processes.toml")
    tiny, full = plan.cells
    assert tiny.stem("h100") == "wan__eager__tiny__h100__processes" and tiny.results_found(tmp_path, "cuda")
    assert not tiny.results_found(tmp_path, "cpu")  # the device is read before the design's suffix
    (state, owed) = campaign.status(plan, tmp_path)
    assert (state.state, state.verdict) == ("planned", "interrupted after 15 of 40 trials")
    assert (owed.state, owed.verdict) == ("planned", None)
    proc = lab_here("campaign", "run", str(ROOT / "campaigns" / "processes.toml"), "--results", str(tmp_path),
                    "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(line.split("#")[0].rstrip().endswith("--resume --replace") for line in proc.stdout.splitlines())


def test_matrices_multiply_out(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = ["wan", "flux"]\nfix = ["all"]\nmode = ["eager", "compile"]\nlayers = 4\n'
                    '[[cell]]\nkind = "sweep"\npipeline = "wan"\nfix = "begin_index"\nvary = "frames=5,21"\n')
    plan = campaign.load(path)
    assert [(c.kind, c.pipeline, c.mode) for c in plan.cells] == [
        ("ab", "wan", "eager"), ("ab", "wan", "compile"), ("ab", "flux", "eager"), ("ab", "flux", "compile"),
        ("sweep", "wan", "eager")]
    assert plan.cells[0].fixes[-1] == "unipc_host_coeffs"  # `all` resolved on the installed diffusers
    assert plan.cells[-1].stem("h200") == "begin_index__frames__eager__full__h200"
    joint = sorted(f.name for f in each_sets("wan")[-1][0])  # the catalog's joint set, as `all` resolves it
    assert {"begin_index", "unipc_host_coeffs"} <= set(joint)
    assert plan.cells[0].stem("h200") == "+".join(joint) + "__eager__full-4l__h200"


@pytest.mark.parametrize("text, message", [
    ("[campaign]\n[[cell]]\npipeline = 'wna'\n", "Did you mean `wan`?"),
    ("[campaign]\n[[cell]]\nfix = 'all'\n", "names no `pipeline`"),
    ("[campaign]\n[[cell]]\nkind = 'swep'\npipeline = 'wan'\n", "Unknown cell kind `swep`"),
    ("[campaign]\ndevice = 'tpu'\n[[cell]]\npipeline = 'wan'\n", "`device` must be"),
    ("[campaign]\n", "no [[cell]] tables"),
    ("[[cell]\n", "not valid TOML"),
    # shapes and types, each named with its place in the file
    ("[[cell]]\npipeline = 'wan'\n", "no [campaign] table"),
    ("cell = {pipeline = 'wan'}\n[campaign]\n", "write [[cell]]"),
    ("campaign = 3\n[[cell]]\npipeline = 'wan'\n", "`campaign` must be a table"),
    ("[campaign]\n[[cell]]\npipeline = 3\n", "[[cell]] number 1: `pipeline` = 3 must be text"),
    ("[campaign]\n[[cell]]\npipeline = 'wan'\nlayers = '4'\n", "`layers` = '4' must be a whole number"),
    ("[campaign]\n[defaults]\nblocks = [4, 8]\n[[cell]]\npipeline = 'wan'\n", "[defaults]: `blocks` = [4, 8] is a list"),
    ("[campaign]\n[[cell]]\nkind = 'script'\ncommand = ' '\nwrites = 'x.json'\n", "`command` is empty"),
    ("[campaign]\ncolour = 'red'\n[[cell]]\npipeline = 'wan'\n", "[campaign] has unknown key(s) ['colour']"),
    ("[campaign]\n[[cell]]\npipeline = 'flux'\nfix = 'unipc_stack'\n", "does not apply"),
])
def test_bad_campaign_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)):
        campaign.load(path)
    proc = lab_here("campaign", "plan", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("ERROR:")


def test_worker_cores_are_disjoint_shares():
    assert cluster.worker_cores(0, 2, set(range(16))) == set(range(8))
    assert cluster.worker_cores(1, 2, set(range(16))) == set(range(8, 16))
    assert cluster.worker_cores(0, 1, {3, 4}) == {3, 4}
    assert cluster.worker_cores(1, 4, {0, 1}) == {0, 1}  # fewer cores than workers: no pinning


def test_a_job_on_a_gpu_pins_that_gpus_share_of_the_host_so_campaigns_side_by_side_share_no_core():
    """Two campaigns on one four-GPU host of 64 cores, `--gpus 0,1` and `--gpus 2,3`: each job gets its GPU's 16
    cores, where each campaign's first worker used to get cores 0-31 (its rank's share of its own two workers)."""
    host = set(range(64))
    first = [cluster.job_cores(rank, 2, gpu, 4, host) for rank, gpu in enumerate(("0", "1"))]
    second = [cluster.job_cores(rank, 2, gpu, 4, host) for rank, gpu in enumerate(("2", "3"))]
    assert first == [set(range(16)), set(range(16, 32))] and second == [set(range(32, 48)), set(range(48, 64))]
    # without the host's GPU count (no nvidia-smi, renumbered GPUs) or without a GPU: the worker's share, as before
    assert cluster.job_cores(1, 2, "3", None, host) == cluster.job_cores(1, 2, None, 4, host) == set(range(32, 64))


def test_a_later_gpus_replaces_device_shs_gpus_all(tmp_path):
    """`campaigns/device.sh` runs `lab campaign run --gpus all ... "$@"`: two campaigns side by side on one host pass
    `--gpus 0` and `--gpus 1`, which must replace `all` (here, without a GPU, `all` alone is refused)."""
    run = ("campaign", "run", str(TINY), "--results", str(tmp_path), "--gpus", "all", "--redo-undecided")
    alone = lab_here(*run, "--dry-run")
    assert alone.returncode == 2 and "`--gpus all`: torch sees no GPU on this host" in alone.stderr
    later = lab_here(*run, "--dry-run", "--gpus", "0")
    assert later.returncode == 0 and later.stdout.strip(), later.stderr[-2000:]


FAKE_PYTHON = """#!/usr/bin/env bash
# `python3 -m lab campaign run ...` as `campaigns/device.sh` starts it: writes the PYTHONPATH it saw, the arguments
# it was given and the campaigns side by side it was told of as a result file of its GPU (`--gpus`, the last given),
# as a campaign writes its results
if [ "$1 $2 $3 $4" = "-m lab campaign run" ]; then
  gpu=; prev=; for a in "$@"; do [ "$prev" = "--gpus" ] && gpu=$a; prev=$a; done
  mkdir -p results/ab/fake && printf '%s\\n' "$PYTHONPATH" "$@" "campaigns=${{LAB_HOST_CAMPAIGNS:-}}" \\
    > "results/ab/fake/gpu-$gpu.json"
  echo "[1/1] fake-$gpu: done in 1 s"
  exit 0
fi
exec {python} "$@"
"""


def test_device_sh_runs_groups_side_by_side_one_per_gpu_and_packs_one_tarball(tmp_path):
    """`campaigns/device.sh FILE COMMON ::: GROUP0 ::: GROUP1`: one campaign per GPU, each with the common arguments,
    its own GPU and its own group (quoting kept), each logging apart, and what they all wrote in one tarball, packed
    once the last ended (two tarballs of side-by-side campaigns each held the other's files and the shared run log,
    and unpacked in the wrong order put back an older run log). Here `python3 -m lab` and `nvidia-smi` are stand-ins:
    what runs on the GPU host is the campaign (`lab campaign run`), tested on its own."""
    import tarfile

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(FAKE_PYTHON.format(python=sys.executable))
    (bin_ / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'GPU 0: Fake'; echo 'GPU 1: Fake'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / ".site").mkdir(parents=True)
    (work / "results").mkdir()
    out.mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "wheel.txt").write_text("carried")
    subprocess.run(["tar", "cJf", str(work / ".site" / "site.tar.xz"), "-C", str(tmp_path), "site"], check=True)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", OUT=str(out), SITE=str(tmp_path / "unpacked"),
               LEFT="100", HARD="200", PACK="n1")
    device_sh = str(ROOT / "campaigns" / "device.sh")
    proc = subprocess.run(["bash", device_sh, "c.toml", "--within-design", ":::", "--only", "flux [a+b] compile",
                           "--only", "X", ":::", "--again", "--only", "Y Z"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the host's copy of the tree may carry an older git HEAD: without the checkout's commit, a warning
    assert "device.sh: warning: LAB_COMMIT is not set" in proc.stdout, proc.stdout
    assert (tmp_path / "unpacked" / "wheel.txt").read_text() == "carried"
    assert sorted(p.name for p in out.iterdir()) == ["gpus.txt", "n1-gpu0.log", "n1-gpu1.log", "n1.tgz"]
    assert "== GPU 0:" in proc.stdout and "[1/1] fake-1: done" in proc.stdout
    with tarfile.open(out / "n1.tgz") as packed:
        assert sorted(packed.getnames()) == ["results/ab/fake/gpu-0.json", "results/ab/fake/gpu-1.json"]
        ran = {gpu: packed.extractfile(f"results/ab/fake/gpu-{gpu}.json").read().decode().splitlines()
               for gpu in "01"}
    assert ran["0"][0] == ran["1"][0] == str(tmp_path / "unpacked")  # the campaigns' PYTHONPATH
    start = ["-m", "lab", "campaign", "run", "--gpus", "all", "--redo-undecided", "--time-limit"]
    assert ran["0"][1:9] == start and ran["0"][10:-1] == ["c.toml", "--within-design", "--gpus", "0", "--only",
                                                          "flux [a+b] compile", "--only", "X"]
    assert ran["1"][10:-1] == ["c.toml", "--within-design", "--gpus", "1", "--again", "--only", "Y Z"]
    # each campaign's jobs learn that two campaigns measure side by side on this host (`LAB_HOST_CAMPAIGNS`)
    assert ran["0"][-1] == ran["1"][-1] == "campaigns=2"
    # without ` ::: `, one campaign over the host's GPUs, as before
    for f in out.iterdir():
        f.unlink()
    proc = subprocess.run(["bash", device_sh, "c.toml", "--only", "W"], cwd=work, env=dict(env, LAB_COMMIT="abc1234"),
                          capture_output=True, text=True, timeout=120)
    assert "LAB_COMMIT" not in proc.stdout, proc.stdout
    assert proc.returncode == 0 and sorted(p.name for p in out.iterdir()) == ["gpus.txt", "n1.log", "n1.tgz"]
    with tarfile.open(out / "n1.tgz") as packed:
        (name,) = packed.getnames()
        assert packed.extractfile(name).read().decode().splitlines()[10:] == ["c.toml", "--only", "W", "campaigns="]


def test_device_sh_check_says_here_what_each_gpu_would_run_and_fails_on_a_group_with_nothing(tmp_path):
    """`CHECK=1 bash campaigns/device.sh ...`, run here before a call: each group's dry run with the same arguments,
    its jobs a line each, exit 1 where a group would start none (a call on four H200s idled three GPUs so, their
    cells past their design since the call before). It installs nothing, packs nothing and needs no GPU."""
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, CHECK="1", PYTHON=sys.executable, OUT=str(out), LEFT="600")
    proc = subprocess.run(["bash", str(ROOT / "campaigns" / "device.sh"), str(TINY), "--results", str(tmp_path),
                           ":::", "--only", "qwenimage_zero_cond", ":::", "--only", "no such cell"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    gpu0, gpu1 = proc.stdout.split("== GPU 1: ")
    assert gpu0.startswith("== GPU 0: 1 job(s)\n  ab-qwenimage_zero_cond-"), proc.stdout
    assert gpu1.startswith("nothing to run: ERROR: `--only no such cell` matches none"), proc.stdout
    assert list(out.iterdir()) == [] and list(tmp_path.glob("ab*")) == []


def test_slurm_workers_ask_for_one_gpu_each():
    pytest.importorskip("dask_jobqueue")
    c = cluster.slurm_cluster({"queue": "gpu", "account": "lab", "walltime": "02:00:00"})
    try:
        script = c.job_script()
    finally:
        c.close()
    assert "#SBATCH -p gpu" in script and "#SBATCH -A lab" in script and "#SBATCH --gres=gpu:1" in script
    assert "#SBATCH -t 02:00:00" in script


def _results(folder: Path) -> dict[str, float]:
    """Every result JSON under `folder` (each must parse: none is half-written) and its modification time. A SIGKILL
    mid-write may leave the writer's hidden temporary file (`.NAME.XXXX.partial.json`), which is not a result and
    which every reader of results passes over (`files.written`)."""
    from lab.base import files

    found = list(folder.glob("ab/*/*.json"))
    assert all(p.name.startswith(".") for p in set(found) - set(files.written(found)))
    out = {}
    for path in files.written(found):
        json.loads(path.read_text())
        out[path.name] = path.stat().st_mtime
    return out


def test_run_resumes_after_a_kill_and_never_leaves_half_a_result(tmp_path):
    from lab.base import files

    flux = tmp_path / "flux.toml"  # the tiny campaign's first job alone: its three cells on one build
    # (of 2 blocks each, not 6: a cell still takes seconds, far longer than the 0.2 s between looks for its result)
    flux.write_text(TINY.read_text().split("[[cell]]\npipeline = \"qwenimage_zero_cond\"")[0]
                    .replace("blocks = 6", "blocks = 2"))
    assert [len(j.cells) for j in campaign.jobs(list(campaign.load(flux).cells))] == [3]
    proc = lab_forked("campaign", "run", str(flux), "--results", str(tmp_path))
    deadline = time.time() + 240
    # a result written whole, not the writer's hidden temporary file (`files.PARTIAL` in its name; `*.json` matches
    # too): a kill on seeing that one, before its rename, left no result, once in a clean-clone CI run
    while time.time() < deadline and not files.written(tmp_path.glob("ab/flux/*.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the campaign and the job it was running
    proc.wait()
    proc.stderr.close()
    first = _results(tmp_path)
    assert 1 <= len(first) < 3
    # the campaign that goes on needs no process of its own (its job is one, as every job is)
    again = lab_here("campaign", "run", str(flux), "--results", str(tmp_path))
    assert again.returncode == 0, again.stderr[-2000:]
    final = _results(tmp_path)
    assert len(final) == 3 and all(final[name] == mtime for name, mtime in first.items())  # kept, not measured again
    plan = lab_here("campaign", "plan", str(flux), "--results", str(tmp_path), "--json")
    assert {c["state"] for c in json.loads(plan.stdout)["cells"]} <= {"measured", "undecided"}
    assert "every cell has a result" in lab_here("campaign", "run", str(flux), "--results", str(tmp_path)).stderr


def test_two_jobs_run_at_once_on_a_local_dask_cluster_where_the_campaign_was_started(tmp_path, monkeypatch):
    """Two jobs at once on a local Dask cluster. Started from any folder, a campaign's results land in that folder's
    results/, where its plan looks for them (they used to land in the lab's own folder, and every re-run repeated
    the job)."""
    pytest.importorskip("distributed")
    # the tiny campaign (its two jobs, of one and three cells), with 2 blocks a cell instead of 6
    tiny = tmp_path / "elsewhere" / TINY.name
    tiny.parent.mkdir()
    tiny.write_text(TINY.read_text().replace("blocks = 6", "blocks = 2"))
    # The campaign runs in this process, started in `tmp_path` (which holds no `lab`: its jobs and workers find this
    # one as a campaign's jobs do, through the path it passes on); its cluster's workers and jobs are processes.
    monkeypatch.chdir(tmp_path)
    proc = lab_here("campaign", "run", str(tiny), "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LAB_WORKERS" not in os.environ  # set for the cluster's workers, and given back
    results = tmp_path / "results"
    log = [json.loads(line) for line in (results / "campaigns" / "campaign_tiny.jsonl").read_text().splitlines()]
    assert sorted(len(e["cells"]) for e in log) == [1, 3] and all(e["exit"] == 0 for e in log)
    (a, b) = sorted(log, key=lambda e: e["started"])
    assert b["started"] < a["started"] + a["seconds"]  # the second started before the first had finished
    assert a["cores"] != b["cores"] or os.cpu_count() < 2  # each worker on its own cores
    assert "cells per hour" in proc.stderr and "local Dask cluster of 2 workers" in proc.stderr
    assert len(_results(results)) == 4
    plan = lab_here("campaign", "plan", str(tiny), "--json")
    assert {c["state"] for c in json.loads(plan.stdout)["cells"]} <= {"measured", "undecided"}
    by = json.loads(plan.stdout)["by_fixes"]  # FLUX.1's set of both fixes; each alone, and Qwen-Image's one
    assert [line.split(":")[0] for line in by] == ["sets of several fixes", "one fix"], by
    assert [line.rsplit(" of ", 1)[1] for line in by] == ["1", "3"] and "planned" not in " ".join(by), by
    assert not list((ROOT / "results" / "ab" / "qwenimage_zero_cond").glob("*__tiny__cpu*"))


def _worker_filters() -> list[str]:
    return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]


def test_the_workers_of_a_cluster_the_lab_closes_log_no_heartbeat_that_meets_its_closing_scheduler(monkeypatch):
    """Closing a cluster it started, the lab closes the scheduler while each worker still beats: a worker whose beat
    met it logged distributed's error with a traceback at the end of a campaign (an interrupted one, in CI). Before
    closing, each worker drops that one message (the one distributed logs, checked in its source) and nothing
    else."""
    distributed = pytest.importorskip("distributed")
    assert cluster.HEARTBEAT_FAILED in inspect.getsource(distributed.worker)

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)

    closing = cluster._ClosingHeartbeat()
    assert not closing.filter(record(cluster.HEARTBEAT_FAILED)) and closing.filter(record("Compute Failed"))
    quiet, closing_filters = cluster._quiet_the_closing, []

    def quiet_and_look(c) -> None:  # what the workers filter as the cluster closes
        quiet(c)
        closing_filters.append(c.run(_worker_filters))

    monkeypatch.setattr(cluster, "_quiet_the_closing", quiet_and_look)
    with cluster.client(cluster.Where(workers=2), {}) as c:
        before = c.run(_worker_filters)
        quiet(c)  # asked here and again on closing: one filter
    (after,) = closing_filters
    assert len(before) == 2 and not any("_ClosingHeartbeat" in f for f in before.values())
    assert [f.count("_ClosingHeartbeat") for f in after.values()] == [1, 1]


def _script(name: str, sleep: float, minutes: float) -> str:
    """A script cell that writes the GPU its job may see and the time limit it was given into `name`, then sleeps."""
    code = (f"import os, time; open('{name}', 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + "
            f"os.environ.get('LAB_DEADLINE', 'none')); time.sleep({sleep})")
    return f'[[cell]]\nkind = "script"\ncommand = "python -c \\"{code}\\""\nwrites = "{name}"\nminutes = {minutes}\n'


def test_one_job_per_gpu_at_a_time_within_a_time_limit(tmp_path, monkeypatch):
    """`--gpus 0,1 --time-limit`: a local Dask cluster of two workers, each job seeing only its worker's GPU; a job
    starts when a GPU is free and its estimate fits in what is left (the 30 min one never does), and the one running
    at the limit is stopped, keeping what it completed; the campaign exits 130."""
    pytest.importorskip("distributed")
    path = tmp_path / "gpus.toml"
    path.write_text('[campaign]\ndevice = "cpu"\n' + _script("a.txt", 3, 0.05) + _script("b.txt", 3, 0.05)
                    + _script("c.txt", 0, 30) + _script("d.txt", 600, 0.05))
    # the campaign in this process, started in `tmp_path` (its cluster's workers and its jobs are processes)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # as a two-GPU host may set it
    proc = lab_here("campaign", "run", str(path), "--gpus", "0,1", "--time-limit", "20s")
    assert "LAB_WORKERS" not in os.environ and "LAB_HOST_GPUS" not in os.environ  # given back by the cluster
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "one Dask worker per GPU of this host (0, 1)" in proc.stderr
    assert re.search(r"\[time limit\] script-c: not started, about 30 min", proc.stderr), proc.stderr[-2000:]
    log = {e["job"]: e for e in map(json.loads, (tmp_path / "results/campaigns/gpus.jsonl").read_text().splitlines())}
    seen = {f: (tmp_path / f).read_text().split() for f in ("a.txt", "b.txt", "d.txt")}
    assert {seen["a.txt"][0], seen["b.txt"][0]} == {"0", "1"}  # the two first jobs side by side, one GPU each
    assert seen["d.txt"][0] in ("0", "1") and not (tmp_path / "c.txt").exists()
    # each job knows when the limit comes (a sequential A/B stops its blocks cleanly before it): 20 s after the start
    deadlines = {float(v[1]) for v in seen.values()}
    assert len(deadlines) == 1 and abs(deadlines.pop() - 20 - min(e["started"] for e in log.values())) < 15
    assert sorted(log) == ["script-a", "script-b", "script-d"]
    a, b, d = log["script-a"], log["script-b"], log["script-d"]
    assert a["exit"] == b["exit"] == 0 and {a["gpu"], b["gpu"]} == {"0", "1"}
    assert a["cores"] != b["cores"] or os.cpu_count() < 2  # each GPU's worker on its own cores
    assert b["started"] < a["started"] + a["seconds"]  # at once, not one after another
    assert d["time_limit"] and d["interrupted"] and d["seconds"] < 20
    assert "script-d stopped at the limit" in proc.stderr and "not run: script-c." in proc.stderr


def test_parallel_runs_without_dask_say_what_is_missing(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_distributed(name, *args, **kwargs):
        if name.startswith("distributed"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    with pytest.raises(UsageError, match=r"one Dask worker per GPU of this host \(0, 1\) needs Dask's `distributed`"):
        with cluster.client(cluster.Where(gpus=("0", "1")), {}):
            pass


def test_only_picks_cells_by_label_in_the_order_given(tmp_path):
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run",
               "--only", "qwenimage_zero_cond", "--only", "[no_progress_bar]", "--only", "qwen")
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = proc.stdout.splitlines()
    assert len(commands) == 2  # the Qwen cell first, then the one flux cell; `qwen` adds nothing new
    assert "--pipeline qwenimage_zero_cond" in commands[0]
    assert "--pipeline flux" in commands[1] and commands[1].count("--fix") == 1 and "no_progress_bar" in commands[1]
    # or by the job `lab campaign plan` lists a cell in (the last column of its table, and its estimates)
    plan = lab_here("campaign", "plan", str(TINY), "--results", str(tmp_path))
    job = next(line.split()[0].rstrip(":") for line in plan.stdout.splitlines()
               if line.startswith("  ab-qwenimage_zero_cond"))
    by_job = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run", "--only", job)
    assert by_job.returncode == 0 and by_job.stdout.splitlines() == [commands[0]], by_job.stderr[-2000:]
    assert "Warning" not in by_job.stderr
    # a text that picks nothing beside one that does (a job id whose count of cells left has changed) is said
    stale = f"{job}-2sets-g1"  # as the id of a job of two sets in an earlier plan
    with_stale = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run", "--only", job,
                          "--only", stale)
    assert with_stale.returncode == 0 and with_stale.stdout.splitlines() == [commands[0]]
    assert f"Warning: `--only {stale}` matches no cell of {TINY}: a job's id counts the cells" in with_stale.stderr


def test_skip_leaves_out_cells_by_label_or_job_after_only(tmp_path):
    """`--skip TEXT` leaves out the cells whose label (or job) contains it, after `--only` picked: the sets of every
    fix without the slow settings, say (`--only "+" --skip offload`)."""
    run = ("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run")
    every = lab_here(*run).stdout.splitlines()
    assert len(every) == 2  # the FLUX.1 job (three cells) and the Qwen-Image one
    skipped = lab_here(*run, "--skip", "qwenimage").stdout.splitlines()
    assert skipped == [line for line in every if "--pipeline flux " in line]
    # after --only: of FLUX.1's three cells the set of both fixes only, then that one left out too
    both = lab_here(*run, "--only", "+").stdout.splitlines()
    assert len(both) == 1 and "hook_registry_cache,no_progress_bar" in both[0] and "--pipeline flux " in both[0]
    none = lab_here(*run, "--only", "+", "--skip", "[hook_registry_cache+")
    assert none.returncode == 0 and none.stdout == "" and "nothing to run" in none.stderr, none.stderr[-2000:]


def test_again_measures_afresh_the_cells_picked_even_with_a_result(tmp_path):
    """`--again --only TEXT`: the cells picked run afresh (`--replace`) though they have a result, a census measured
    before it recorded the GPU idle, say; without `--only` it is refused, so a whole campaign never runs again by a
    slip."""
    measured = tmp_path / "ab" / "qwenimage_zero_cond" / "qwen_modulate_index__eager__tiny__cpu.json"
    measured.parent.mkdir(parents=True)
    stored = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    measured.write_text(json.dumps({**stored, "verdict": "faster"}))
    run = ("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run")
    assert [line for line in lab_here(*run).stdout.splitlines() if "qwenimage" in line] == []  # it has its result
    [again] = lab_here(*run, "--again", "--only", "qwenimage").stdout.splitlines()
    assert "--pipeline qwenimage_zero_cond" in again and again.split("    #")[0].endswith("--replace")
    assert "--resume" not in again
    refused = lab_here(*run, "--again")
    assert refused.returncode == 2 and "`--again` measures afresh cells that have a result" in refused.stderr


def as_undecided(stored: dict, **more) -> dict:
    """A committed decided result as an undecided one whose numbers agree with themselves (results are checked when
    read): its intervals widened past 1 and past the margin, the estimate still inside them."""
    stats = dict(stored["stats"])
    low, high = min(stats["ratio"], 1) * 0.5, max(stats["ratio"], 1) * 1.5
    stats.update(ci=[low, high], ci_equivalence=[low, high], direction=None, equivalent=False, verdict="undecided")
    return {**stored, "stats": stats, "verdict": "undecided", **more}


def test_redo_undecided_goes_on_from_an_undecided_ab(tmp_path):
    undecided = tmp_path / "ab" / "qwenimage_zero_cond" / "qwen_modulate_index__eager__tiny__cpu.json"
    undecided.parent.mkdir(parents=True)
    stored = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    undecided.write_text(json.dumps(as_undecided(stored)))  # what campaign plan reads of it
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run", "--redo-undecided")
    assert proc.returncode == 0, proc.stderr[-2000:]
    flux, qwen = sorted(proc.stdout.splitlines(), key=lambda line: "qwenimage" in line)
    assert "--resume --replace" in qwen and "--resume" not in flux and "--replace" not in flux


def test_only_takes_the_job_id_plan_lists_when_redo_undecided_joins_an_undecided_cell_to_it(tmp_path):
    """`plan` lists the owed cells' jobs; with `--redo-undecided` an undecided cell of the same build joins its job,
    whose id counts its cells: FLUX.1's two owed cells are `...-2sets-g1` in the plan and would run in `...-3sets-g1`.
    `--only` with the plan's id picks them (it matched nothing before, and a device call ran without them)."""
    undecided = tmp_path / "ab" / "flux" / "no_progress_bar__eager__tiny__cpu.json"
    undecided.parent.mkdir(parents=True)
    stored = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    undecided.write_text(json.dumps(as_undecided(stored)))
    plan = lab_here("campaign", "plan", str(TINY), "--results", str(tmp_path))
    assert "  ab-flux-eager-tiny-2sets-g1: " in plan.stdout, plan.stdout
    run = ("campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run", "--redo-undecided")
    proc = lab_here(*run, "--only", "ab-flux-eager-tiny-2sets-g1")
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr[-2000:]
    [owed] = proc.stdout.splitlines()
    assert "--pipeline flux " in owed and owed.count("--fix ") == 2 and "--resume" not in owed
    [every] = lab_here(*run, "--only", "ab-flux-eager-tiny-3sets-g1").stdout.splitlines()  # the id it runs in
    assert every.count("--fix ") == 3 and "--resume" in every, every


def test_a_campaigns_summary_counts_the_cells_undecided_at_their_most_blocks_apart():
    from types import SimpleNamespace as Cell

    from lab.results.states import summary

    cells = [Cell(state="measured"), Cell(state="undecided", at_limit=True), Cell(state="undecided", at_limit=False),
             Cell(state="planned"), Cell(state="one pair"), Cell(state="planned", past_design=True)]
    assert summary(cells) == ("1 measured, 2 undecided (1 at their design's most blocks), 1 one pair, 2 planned "
                              "(1 likely past their design's most if their fixes change nothing) of 6 cells")
    assert summary(cells[:1], zeros=True) == "1 measured, 0 undecided, 0 failed, 0 planned of 1 cells"


def test_a_campaigns_ab_cells_are_counted_by_what_they_time():
    """Sets of several fixes, one fix and fixes over a base, each by verdict: the counts FINDINGS quotes (it counted
    them by hand before, with definitions of its own). A census is none of them."""
    from types import SimpleNamespace as NS

    from lab.results.states import by_fixes

    def cell(fixes, state, verdict=None, base=(), kind="ab"):
        return NS(cell=NS(kind=kind, fixes=tuple(fixes.split("+")), base=base), state=state, verdict=verdict)

    states = [cell("a+b", "measured", "faster"), cell("a+b", "measured", "equivalent within ±1%"),
              cell("a+b", "measured", "faster"), cell("a+b+c", "undecided", "insufficient samples"),
              cell("a", "measured", "slower"), cell("a", "measured", "not exercised"), cell("b", "planned"),
              cell("b", "measured", "faster", base=("k",)), cell("a", "measured", "faster", kind="census")]
    assert by_fixes(states) == [
        "sets of several fixes: 3 decided (2 faster, 1 equivalent within ±1%), 1 undecided of 4",
        "one fix: 1 decided (1 slower), 1 settled otherwise (1 not exercised), 1 planned of 3",
        "over a base: 1 decided (1 faster) of 1"]
    assert by_fixes(states[-1:]) == []


def test_redo_undecided_leaves_an_ab_undecided_at_its_most_blocks(tmp_path):
    """An A/B whose sequential design ran its most blocks undecided is an answer: `plan` counts it apart,
    `--redo-undecided` leaves it alone (it used to measure it afresh on every call, GPU time for a replicate), and
    `--again --only` still measures it afresh."""
    undecided = tmp_path / "ab" / "qwenimage_zero_cond" / "qwen_modulate_index__eager__tiny__cpu.json"
    undecided.parent.mkdir(parents=True)
    stored = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    undecided.write_text(json.dumps(as_undecided(stored, stopped="max blocks")))
    plan = lab_here("campaign", "plan", str(TINY), "--results", str(tmp_path))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "1 undecided (1 at their design's most blocks)" in plan.stdout
    run = ["campaign", "run", str(TINY), "--results", str(tmp_path), "--dry-run"]
    proc = lab_here(*run, "--redo-undecided")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "qwenimage" not in proc.stdout and "--pipeline flux" in proc.stdout
    [again] = lab_here(*run, "--again", "--only", "qwenimage").stdout.splitlines()
    assert "--pipeline qwenimage_zero_cond" in again and "--resume" not in again


def _campaign_in_its_blocks(tmp_path):
    """A campaign (a process in a process group of its own) whose one A/B job has measured two of its 400 blocks: the
    campaign process, its file and the job logs' folder."""
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY.read_text().replace("blocks = 6", "blocks = 400"))
    proc = lab_forked("campaign", "run", str(tiny), "--results", str(tmp_path), "--only", "qwenimage_zero_cond")
    log = tmp_path / "logs" / "tiny"
    deadline = time.time() + 240
    while time.time() < deadline and not any("block 2/" in p.read_text() for p in log.glob("*.log")):
        time.sleep(0.2)
    return proc, tiny, log


def test_ctrl_c_lets_the_running_job_keep_its_result_and_logs_it_as_interrupted(tmp_path):
    """A Ctrl-C (SIGINT to the process group, as a terminal sends it) while a job is in its blocks: the job writes
    what it completed before it exits, the run log says interrupted (not failed), and the campaign exits 130."""
    proc, tiny, log = _campaign_in_its_blocks(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    assert "INTERRUPTED" in err and "goes on from there" in err
    (entry,) = [json.loads(line) for line in (tmp_path / "campaigns" / "tiny.jsonl").read_text().splitlines()]
    assert entry["interrupted"] is True
    assert list((tmp_path / "ab" / "qwenimage_zero_cond").glob("*.json")), "the interrupted job kept no result"
    plan = json.loads(lab_here("campaign", "plan", str(tiny), "--results", str(tmp_path), "--json").stdout)
    assert [c["state"] for c in plan["cells"] if "qwenimage" in c["label"]] == ["undecided"]


_KEEPER = """import signal, sys, time
name = sys.argv[1]
def keep(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the lab's jobs take a second one
    time.sleep(3)  # the time a job takes to write what it completed
    open(name + '.kept', 'w').write('kept')
    sys.exit(130)
signal.signal(signal.SIGINT, keep)
signal.signal(signal.SIGTERM, keep)
open(name + '.started', 'w').close()
time.sleep(600)
"""


@pytest.mark.parametrize("to_group", [signal.SIGINT, None], ids=["ctrl-c-to-the-group", "sigterm-to-the-campaign"])
def test_an_interrupted_campaign_on_a_local_dask_cluster_waits_for_its_jobs_to_keep_what_they_completed(tmp_path,
                                                                                                        to_group):
    """A Ctrl-C reaches every process of the terminal's group: the campaign, its Dask workers and their jobs. The
    workers used to die of it, each printing a traceback, and the campaign to end at once: the jobs were still writing
    what they completed (a device call packed its results then, and lost them) and the run log never heard of them.
    Now the workers take no notice of it, the campaign waits for the jobs it reached, logs each as interrupted, and
    exits 130 with no traceback. A SIGTERM sent to the campaign alone (a scheduler's time limit) it passes on to
    its jobs."""
    pytest.importorskip("distributed")
    from lab.campaigns.cluster import JOB_GRACE_S

    (tmp_path / "keeper.py").write_text(_KEEPER)
    path = tmp_path / "keep.toml"
    # two jobs that keep what they completed on a Ctrl-C, and one that takes it as a Python script does by default:
    # it ends at once (its worker ignores a Ctrl-C, and the job must not inherit that), and so does the campaign
    sleeper = f"import time; open('{tmp_path / 'c.started'}', 'w').close(); time.sleep(600)"
    path.write_text('[campaign]\ndevice = "cpu"\n' + "".join(
        f'[[cell]]\nkind = "script"\ncommand = "python {tmp_path / "keeper.py"} {tmp_path / name}"\n'
        f'writes = "{name}.kept"\nminutes = 1\n' for name in ("a", "b"))
        + f'[[cell]]\nkind = "script"\ncommand = "python -c \\"{sleeper}\\""\nwrites = "c.kept"\nminutes = 1\n'
        + '[[cell]]\nkind = "script"\ncommand = "python -c pass"\nwrites = "d.kept"\nminutes = 1\n')
    # a fresh interpreter in a session of its own, not `lab_forked`: forked from a process that had run a local Dask
    # cluster itself (this file's other tests, in this process), the campaign's cluster never started its jobs
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "campaign", "run", str(path), "--results",
                             str(tmp_path / "results"), "--workers", "3"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not all((tmp_path / f"{n}.started").exists() for n in "abc"):
        time.sleep(0.2)
    time.sleep(1)  # the jobs' handlers are in place
    if to_group:
        os.killpg(proc.pid, to_group)
    else:
        proc.send_signal(signal.SIGTERM)
    interrupted = time.time()
    _, err = proc.communicate(timeout=JOB_GRACE_S + 60)
    assert proc.returncode == 130, err[-3000:]
    assert time.time() - interrupted < JOB_GRACE_S, "the campaign waited for a job that took no notice of a Ctrl-C"
    assert "Traceback" not in err, err[-3000:]
    assert all((tmp_path / f"{n}.kept").exists() for n in "ab")  # before the campaign ended
    log = {e["job"]: e for e in map(json.loads, (tmp_path / "results/campaigns/keep.jsonl").read_text().splitlines())}
    assert sorted(log) == ["script-a", "script-b", "script-c"], log  # the fourth job, queued, never started
    assert all(e["interrupted"] and not e.get("time_limit") for e in log.values()), log
    assert log["script-a"]["exit"] == log["script-b"]["exit"] == 130, log
    assert err.count("INTERRUPTED") == 3 and "not run: script-d." in err, err[-3000:]


@pytest.mark.parametrize("to_group", [True, False], ids=["timeout-to-the-group", "scheduler-to-the-campaign"])
def test_a_time_limits_sigterm_keeps_the_running_jobs_result_as_a_ctrl_c_does(tmp_path, to_group):
    """`timeout` sends SIGTERM to its whole process group; a scheduler may send it to the campaign alone, which passes
    it on to its job. Either way the job keeps what it completed and the run log says interrupted, not failed."""
    proc, _, log = _campaign_in_its_blocks(tmp_path)
    if to_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    (entry,) = [json.loads(line) for line in (tmp_path / "campaigns" / "tiny.jsonl").read_text().splitlines()]
    assert entry["interrupted"] is True and entry["exit"] == 130, entry
    assert list((tmp_path / "ab" / "qwenimage_zero_cond").glob("*.json")), "the terminated job kept no result"
    assert "INTERRUPTED" in err
    assert re.search(r"interrupted after \d+ of at most 400 blocks", next(log.glob("*.log")).read_text())


def test_a_time_limit_starts_only_the_jobs_that_fit_and_stops_the_one_running_at_it(tmp_path, monkeypatch):
    """`--time-limit`, one job after another on this host: a job whose estimate (the file's own, 30 min) does not fit
    in what is left never starts, and the jobs that fit go first; one that fits runs until the limit and is stopped as
    by a Ctrl-C, keeping what it wrote; the campaign says what did not run and exits 130 (the job was interrupted).
    Script jobs: that an A/B job stops its blocks before a campaign's limit and keeps them is `test_ab`'s
    (`test_a_campaigns_time_limit_stops_the_blocks_cleanly_and_the_run_can_go_on`), and that a stopped A/B job keeps
    its result is the Ctrl-C and SIGTERM tests' below; an A/B job here cost 45 s of a 2-core machine's suite."""
    path = tmp_path / "limit.toml"
    path.write_text('[campaign]\ndevice = "cpu"\n' + _script("big.txt", 0, 30) + _script("run.txt", 600, 0.05))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    proc = lab_here("campaign", "run", str(path), "--time-limit", "8s")
    assert proc.returncode == 130, proc.stderr[-2000:]
    # the job that fits goes first, though the file lists it second; the other never gets a turn
    assert "[1/2] script-run: STOPPED AT THE TIME LIMIT" in proc.stderr, proc.stderr[-2000:]  # not a Ctrl-C's word
    assert "stopped at the limit" in proc.stderr and "not run: script-big" in proc.stderr
    assert "failed" not in proc.stderr  # an interrupted job is not a failed one
    (entry,) = [json.loads(line) for line in (tmp_path / "results/campaigns/limit.jsonl").read_text().splitlines()]
    assert entry["job"] == "script-run" and entry["time_limit"] and entry["interrupted"]
    assert 3 < entry["seconds"] < 8 + 30, entry  # started within the limit's first seconds, stopped at it
    assert (tmp_path / "run.txt").exists() and not (tmp_path / "big.txt").exists()


def test_a_dry_run_under_a_time_limit_says_which_jobs_would_start(tmp_path):
    """Under `--time-limit`, a dry run says of each job whether it would end within the limit, start and stop at it,
    or not start, in the order the run would take them: those that fit whole first."""
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY.read_text().replace('fix = "each"', 'fix = "each"\nminutes = 2')
                    .replace('fix = "qwen_modulate_index"', 'fix = "qwen_modulate_index"\nminutes = 1'))
    proc = lab_here("campaign", "run", str(tiny), "--results", str(tmp_path), "--time-limit", "4m", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the job that fits the limit whole goes first, though the file lists it second
    qwen, flux = proc.stdout.splitlines()
    assert qwen.endswith("about 60 s, 60 s of 4 min by its end") and "qwen_modulate_index" in qwen
    assert flux.endswith("about 6 min, would not start within the limit")  # three cells of 2 minutes
    # on two GPUs each job goes to the worker free first: within 7 min both start, side by side
    proc = lab_here("campaign", "run", str(tiny), "--results", str(tmp_path), "--time-limit", "7m", "--dry-run",
                    "--gpus", "0,1")
    flux, qwen = proc.stdout.splitlines()
    assert flux.endswith("about 6 min, 6 min of 7 min by its end on worker 1")
    assert qwen.endswith("about 60 s, 60 s of 7 min by its end on worker 2")


def test_the_plan_counts_the_runs_of_a_time_limit_the_jobs_take(tmp_path):
    """`plan --time-limit TIME [--workers N]`: how many runs of that length the owed jobs take, fit-whole jobs first,
    and which cannot start in one (here a job of three 2-minute cells, the file's own estimate, which keeps nothing at
    a limit, in runs of 4 minutes); bad values are one line each."""
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY.read_text().replace('fix = "each"', 'fix = "each"\nminutes = 2')
                    .replace('fix = "qwen_modulate_index"', 'fix = "qwen_modulate_index"\nminutes = 1'))
    proc = lab_here("campaign", "plan", str(tiny), "--results", str(tmp_path), "--time-limit", "4m")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("In runs of 4 min on one worker (`run --time-limit`, fit-whole jobs first): about 1 run(s); 0 time(s) a "
            "job stops at the limit" in proc.stdout), proc.stdout[-2000:]
    assert re.search(r"1 job\(s\) cannot start in such a run, even to stop at its limit \(a longer run can\):\n"
                     r"  ab-flux-\S+: about 6 min, and it keeps nothing at a limit: it must fit whole\n", proc.stdout)
    proc = lab_here("campaign", "plan", str(tiny), "--results", str(tmp_path), "--time-limit", "7m", "--workers", "2")
    assert "In runs of 7 min on 2 workers" in proc.stdout and "about 1 run(s)" in proc.stdout
    assert "cannot start" not in proc.stdout, proc.stdout[-2000:]
    counted = json.loads(lab_here("campaign", "plan", str(tiny), "--results", str(tmp_path), "--time-limit", "4m",
                                  "--json").stdout)["runs"]
    assert counted["limit_s"] == 240 and counted["runs"] == 1 and [j[:8] for j in counted["never"]] == ["ab-flux-"]
    for bad, says in ((["--time-limit", "soon"], "`--time-limit soon`"), (["--workers", "0"], "`--workers`")):
        proc = lab_here("campaign", "plan", str(tiny), "--results", str(tmp_path), *bad)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _committed(results: Path, pipeline: str, *names: str) -> list[Path]:
    """Copies of committed A/B results (`results/ab/PIPELINE/NAME.json`) into `results`, as `lab campaign plan` finds
    them; where `tests/data/results` keeps one as it was when still undecided (a campaign goes on with the committed
    one, and its blocks and call times change), that one."""
    (results / "ab" / pipeline).mkdir(parents=True, exist_ok=True)
    copies = []
    for name in names:
        measured = _undecided(pipeline, f"{name}.json")
        copies.append(results / "ab" / pipeline / measured.name)
        copies[-1].write_bytes(measured.read_bytes())
    return copies


def _undecided(pipeline: str, name: str) -> Path:
    """A committed A/B result, or its copy in `tests/data/results` from before its cell went on (the copy of Wan's and
    LTX2's `group_offload_keep_host` in group offloading: 3 and 2 H200 blocks, undecided; Qwen-Image's: 4 H200 blocks,
    and 3 on an H100; Qwen-Image's eager group-offload set at its first 6 H100 blocks; Flux2 Klein's
    `group_offload_keep_host` at 1 H200 block; FLUX.1's two model-offload cells that decode at 4 H200 blocks each;
    Flux2 Klein's compiled model-offload set at 3 H100 blocks, and the set without `model_offload_keep_host` at 2
    H200 blocks; Flux2 Klein's eager group-offload set cut off before its first block, and its `flux2_unpack_hw` at 4
    H200 blocks)."""
    kept = DATA / "ab" / pipeline / name
    return kept if kept.exists() else ROOT / "results" / "ab" / pipeline / name


def _estimate_of(results: Path, cell: str) -> campaign.Estimate:
    """`campaign.estimate` of the one job of a campaign of one cell (its TOML lines)."""
    path = results / "c.toml"
    path.write_text(f"[campaign]\n[[cell]]\n{cell}")
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    return campaign.estimate(job, results)


def test_a_set_without_blocks_of_its_own_is_estimated_from_a_result_over_some_of_its_fixes(tmp_path):
    """Qwen-Image's eager group-offload set on an H100 host: its control's calls (37.4 s on the H200 host) planned
    187 s blocks and 9 minutes before a first one, so a 10-minute device call never started it, while
    `group_offload_keep_host` alone, most of the set's change, took 49 to 61 s blocks there (kept in tests/data).
    A result over some of the set's fixes, same base, gives the set's blocks and set-up, on the GPU it will run on
    first; a result of another fix does not."""
    kept = DATA / "ab" / "qwenimage" / "group_offload_keep_host__eager__full-8l-group_offload__h100.json"
    part = json.loads(kept.read_text())
    folder = tmp_path / "ab" / "qwenimage"
    folder.mkdir(parents=True)
    (folder / kept.name).write_bytes(kept.read_bytes())
    cell = ('pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\nprofile_calls = 1\n'
            'setting = "group_offload:block_level"\nbudget = "25m"\nfix = "{}"\n')
    the_set = _estimate_of(tmp_path, cell.format("group_offload_keep_host,hook_registry_cache,no_progress_bar"))
    block_s = sorted(part["block_s"])[1]
    calls = f"{stats.median([x for b in part['samples']['control']['raw_wall_ms'] for x in b]):,.0f} ms"
    assert the_set.basis == (f"{block_s:,.0f} s blocks from {kept.stem}, over some of its fixes, at {calls} control "
                             f"calls (its own: {calls}); at most {math.ceil(25 * 60 / block_s)} blocks"), the_set.basis
    phases = part["phase_s"]
    pair_s = phases["profile"] / part["profile"]["calls"]
    # its shortest useful run ends after its one profiled pair: the next run goes on from it, profiles kept
    assert the_set.least == pytest.approx(part["build_s"] + phases["warmup"] + phases["verify"] + pair_s)
    # another fix alone, or a set that lacks `group_offload_keep_host`, has no such part: its control's calls count
    # for its blocks, and that result's set-up and profiled pair for its own (the profiler's cost is the setting's:
    # 1.1x a plain call in Flux2 Klein's group offloading, where a guessed 3x kept its cells from starting)
    for other in ("hook_registry_cache", "hook_registry_cache,no_progress_bar"):
        alone = _estimate_of(tmp_path, cell.format(other))
        assert f" ms calls measured in {kept.stem};" in alone.basis and alone.seconds > the_set.seconds, alone
        assert alone.least == pytest.approx(the_set.least), alone
    # on one build with a cell of one fix (a campaign's job), each cell counts its own blocks
    path = tmp_path / "c.toml"
    path.write_text("[campaign]\n[[cell]]\n" + cell.replace('fix = "{}"', 'fix = ["hook_registry_cache", '
                                                           '"group_offload_keep_host,hook_registry_cache,no_progress_bar"]'))
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    both = campaign.estimate(job, tmp_path)
    assert both.seconds == pytest.approx(alone.seconds + the_set.seconds - part["build_s"]), (both, alone, the_set)


def test_a_profiled_pair_is_planned_from_the_time_its_kept_profiles_took(tmp_path):
    """A run that goes on from another's blocks keeps that run's profiles and records its own phases, without theirs:
    Flux2 Klein's group-offload cells, resumed, lost the 104 s their one profiled pair took, were planned at 274 s a
    pair (3x a 45.6 s call, twice) and could not start in an 8-minute device call. The profiles keep their time."""
    kept = DATA / "ab" / "qwenimage" / "group_offload_keep_host__eager__full-8l-group_offload__h100.json"
    part = json.loads(kept.read_text())
    folder = tmp_path / "ab" / "qwenimage"
    folder.mkdir(parents=True)
    cell = ('pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\nprofile_calls = 1\n'
            'setting = "group_offload:block_level"\nbudget = "25m"\n'
            'fix = "group_offload_keep_host,hook_registry_cache,no_progress_bar"\n')
    took = part["phase_s"].pop("profile")
    went_on = dict(part, profile=dict(part["profile"], seconds=took))  # its phases are the run that went on's
    (folder / kept.name).write_text(json.dumps(went_on))
    from_profiles = _estimate_of(tmp_path, cell)
    pair_s = took / part["profile"]["calls"]
    assert from_profiles.least == pytest.approx(part["build_s"] + part["phase_s"]["warmup"]
                                                + part["phase_s"]["verify"] + pair_s)
    (folder / kept.name).write_text(json.dumps(part))  # as such results were written before: a guessed pair
    guessed = _estimate_of(tmp_path, cell)
    assert guessed.least != pytest.approx(from_profiles.least), (guessed, from_profiles)


def test_a_pair_its_part_kept_no_time_for_is_planned_from_another_result_at_the_setting(tmp_path):
    """Qwen-Image's compiled group-offload set is planned on an H200 host from its part there, eager
    `group_offload_keep_host`, whose run went on from another's profiles before they kept their time: its pair was
    guessed at 3x a 37.4 s control call, twice, and the job could not start in a lent call. The H100 host's run at
    the same setting kept its profiles' phase (3 pairs at 16.3 s control calls): scaled to the control's calls, it
    plans the pair (the compiled pairs in group offloading took 1.2 to 1.6 control calls, 2026-11-28)."""
    (h200,) = _committed(tmp_path, "qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h200")
    (h100,) = _committed(tmp_path, "qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h100")
    part = json.loads(h200.read_text())
    assert "seconds" not in part["profile"] and "profile" not in part["phase_s"]  # the part kept no pair's time
    kept = json.loads(h100.read_text())
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "compile"\n'
                    'profile_calls = 1\nsetting = "group_offload:block_level"\nbudget = "25m"\nfix = "group_offload_keep_host,'
                    'hook_registry_cache,no_progress_bar,qwen_modulate_index,qwen_rope_device"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    learned = campaign.estimate(job, tmp_path, device="h200")
    phases = dict(kept["phase_s"])
    pair_s = phases.pop("profile") / kept["profile"]["calls"]
    h100.write_text(json.dumps(dict(kept, phase_s=phases)))  # as if it had kept none either: the guess
    guessed = campaign.estimate(job, tmp_path, device="h200")

    def control_s(result: dict) -> float:
        return stats.median([x for block in result["samples"]["control"]["raw_wall_ms"] for x in block]) / 1e3

    call_s = control_s(part)
    assert 30 < call_s < 45 and 10 < control_s(kept) < 20
    planned = call_s / control_s(kept) * pair_s
    assert guessed.least - learned.least == pytest.approx(6 * call_s - planned)
    assert 1 < planned / call_s < 4  # the H100 host's pairs took 3.4 control calls; compiled ones 1.2 to 1.6


def test_a_part_timed_at_other_control_calls_is_scaled_to_the_cells_own(tmp_path):
    """The part above was timed on the H100 host of 2026-11-25, whose copies back cost less than half of later hosts'
    (16.3 s control calls; 33.5 s on the H200 host of 2026-11-27 at 4 blocks, newer, over the same base). Its 59 s
    blocks planned the set at 59 s on an H100 host; the set took 91 to 133 s there (2026-11-27). Scaled by the newer
    control's calls over its own, the part's blocks say about what the set's took."""
    kept = DATA / "ab" / "qwenimage" / "group_offload_keep_host__eager__full-8l-group_offload__h100.json"
    folder = tmp_path / "ab" / "qwenimage"
    folder.mkdir(parents=True)
    (folder / kept.name).write_bytes(kept.read_bytes())
    _committed(tmp_path, "qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h200")
    fixes = "group_offload_keep_host,hook_registry_cache,no_progress_bar,qwen_modulate_index,qwen_rope_device"
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\n'
                    f'profile_calls = 1\nsetting = "group_offload:block_level"\nbudget = "25m"\nfix = "{fixes}"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    planned = campaign.estimate(job, tmp_path, device="h100")
    block_s = float(planned.basis.split(" s blocks from ")[0])
    newer = _undecided("qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h200.json")
    calls = stats.median([x for b in json.loads(newer.read_text())["samples"]["control"]["raw_wall_ms"] for x in b])
    assert planned.basis.split(" s blocks from ")[1].startswith(f"{kept.stem}, over some of its fixes, at "
                                                               f"{calls:,.0f} ms control calls (its own: 16,316 ms)")
    the_set = _undecided("qwenimage", f"{fixes.replace(',', '+')}__eager__full-8l-group_offload__h100.json")
    measured = json.loads(the_set.read_text())["block_s"]  # its first 6 blocks (kept in tests/data)
    assert stats.median(json.loads(kept.read_text())["block_s"]) < min(measured) / 1.5  # unscaled: far too short
    assert min(measured) < block_s < 1.1 * max(measured), (block_s, measured)


def test_of_several_parts_a_set_is_estimated_from_the_one_with_the_most_of_its_change(tmp_path):
    """Flux2 Klein's compiled set in group offloading has two parts measured eager on the H200 host (kept in
    tests/data): `group_offload_keep_host` (a 159 s block at 46.5 s control calls) and, newer, `flux2_unpack_hw` (4
    blocks of 218 to 234 s at about 45 s: it changes about nothing there). Planned from the newest part, the set
    could or could not start in an 8-minute call as one or the other had been measured last. The part whose blocks
    are shortest for its control's calls holds the most of the set's change, whichever is newer."""
    keep, unpack = (f"{fix}__eager__full-4l-group_offload__h200" for fix in ("group_offload_keep_host",
                                                                            "flux2_unpack_hw"))
    (unpack_path,) = _committed(tmp_path, "flux2", unpack)
    fixes = "flux2_unpack_hw,group_offload_keep_host,hook_registry_cache,no_progress_bar,transformer_dtype"
    cell = ('pipeline = "flux2"\nsize = "full"\nlayers = 4\nmode = "compile"\nprofile_calls = 1\n'
            f'setting = "group_offload:block_level"\nbudget = "32m"\nfix = "{fixes}"\n')
    alone = _estimate_of(tmp_path, cell)
    assert f" s blocks from {unpack}, over some of its fixes" in alone.basis, alone.basis
    (keep_path,) = _committed(tmp_path, "flux2", keep)
    assert json.loads(keep_path.read_text())["created"] < json.loads(unpack_path.read_text())["created"]
    both = _estimate_of(tmp_path, cell)
    assert f" s blocks from {keep}, over some of its fixes" in both.basis, both.basis
    assert float(both.basis.split(" s blocks")[0]) < float(alone.basis.split(" s blocks")[0]), (both, alone)
    assert both.least < alone.least and both.seconds < alone.seconds, (both, alone)


def test_a_cell_measured_on_another_gpu_is_estimated_from_its_own_blocks_there(tmp_path):
    """Flux2 Klein's compiled set in model CPU offload, to run on an H200 host: it had 3 blocks on an H100 host (78 s
    at 22.7 s control calls, kept in tests/data), which a run there cannot go on from, and the set without
    `model_offload_keep_host` had 2 on the H200 host (83 s at 16.5 s). From the part, scaled to the newest control
    calls, the plan said 113 s blocks, most of them a copy back the set removes; the cell's own blocks say 78 s, nearer
    what the set then took there (37 to 54 s, 8 blocks, committed)."""
    fixes = "flux2_unpack_hw,hook_registry_cache,model_offload_keep_host,no_progress_bar,transformer_dtype"
    stem = f"{fixes.replace(',', '+')}__compile__full-model_cpu_offload"
    part = ("flux2_unpack_hw+hook_registry_cache+no_progress_bar+transformer_dtype"
            "__compile__full-model_cpu_offload__h200")
    (part_path,) = _committed(tmp_path, "flux2", part)
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "flux2"\nsize = "full"\nmode = "compile"\nprofile_calls = 1\n'
                    f'setting = "model_cpu_offload"\nbudget = "20m"\nfix = "{fixes}"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    without = campaign.estimate(job, tmp_path, device="h200")
    assert f" s blocks from {part}, over some of its fixes, at 16,523 ms control calls" in without.basis, without.basis
    time.sleep(0.01)  # (the newer)
    (own,) = _committed(tmp_path, "flux2", f"{stem}__h100")
    planned = campaign.estimate(job, tmp_path, device="h200")
    assert planned.basis.split(" s blocks from ")[1].startswith(
        f"{own.stem}, this cell on another GPU, at 22,678 ms control calls (its own: 22,678 ms)"), planned.basis
    block_s = float(planned.basis.split(" s blocks from ")[0])
    part_s = stats.median(json.loads(part_path.read_text())["block_s"]) * 22_678 / 16_523  # the part, scaled
    taken = json.loads((ROOT / "results/ab/flux2" / f"{stem}__h200.json").read_text())["block_s"]
    assert max(taken) < block_s < part_s and block_s - max(taken) < part_s - block_s, (block_s, part_s, taken)
    # on the H100 host, where it can go on from them, its own blocks count as they are
    assert campaign.estimate(job, tmp_path, resume=True, device="h100").basis.startswith("this cell's 3 blocks so far")


def test_each_cell_of_a_job_is_estimated_from_its_own_result(tmp_path):
    """FLUX.1's two model-offload cells that decode, one job on one build, each undecided at 4 blocks on an H200 host
    (kept in tests/data). Only a job of one cell read its own result: going on, this one was planned afresh from the
    control's calls (128 s blocks, where the cells' were 61 s and under) and warned that an 8-minute budget could not
    reach the 8 blocks the rule needs, as if neither had any."""
    _committed(tmp_path, "flux", *(f"{fix}__eager__full-decode-model_cpu_offload__h200"
                                   for fix in ("model_offload_keep_host", "model_offload_pinned")))
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "flux"\nsize = "full"\nmode = "eager"\n'
                    'setting = "model_cpu_offload"\nfull_decode = true\nprofile_calls = 1\nbudget = "8m"\n'
                    'fix = ["model_offload_keep_host", "model_offload_pinned"]\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    going_on = campaign.estimate(job, tmp_path, resume=True, device="h200")
    assert going_on.basis.startswith("this cell's 4 blocks so far") and going_on.warning is None, going_on
    afresh = campaign.estimate(job, tmp_path, device="h200")  # each from 0 blocks: 8 minutes buys 7 of the 8
    assert "fewer than the 8 the rule needs to call a change" in afresh.warning, afresh


def test_an_ab_is_estimated_from_a_result_whose_control_runs_what_its_own_does(tmp_path):
    """FLUX.1 in model CPU offload on an H100: `model_offload_keep_host` alone (control 22.4 s calls, the copy back to
    the host in each) and, newer, the other fixes over it (both arms without the copy back, 4.6 s). A cell of
    another fix (one that includes none: `model_offload_pinned` would hold the first as its part) takes the first's
    control calls, a cell over `model_offload_keep_host` the second's: before, both took the newest result's, and a
    plain cell was planned at a fifth of its time."""
    _committed(tmp_path, "flux", *(f"{name}__eager__full-model_cpu_offload__h100" for name in (
        "model_offload_keep_host", "hook_registry_cache+model_offload_keep_host+no_progress_bar-over-"
        "model_offload_keep_host")))
    calls = {}
    for base in ("", 'base = "model_offload_keep_host"\n'):
        basis = _estimate_of(tmp_path, 'pipeline = "flux"\nsize = "full"\nmode = "eager"\n'
                                       f'setting = "model_cpu_offload"\nfix = "hook_registry_cache"\n{base}').basis
        calls[base] = float(basis.split(" ms calls")[0].replace(",", ""))
        assert ("-over-model_offload_keep_host__" in basis) == bool(base), basis
    assert calls[""] > 20_000 and calls['base = "model_offload_keep_host"\n'] < 6_000, calls


def test_an_ab_is_estimated_from_a_result_that_timed_blocks_before_one_cut_off_before_them(tmp_path):
    """Flux2 Klein in group offloading at 4 blocks on an H200 host: `group_offload_keep_host` timed a block (control
    46.5 s calls), and the newer set was cut off before its first, keeping a verification call of 26.4 s, of no arm
    in particular. A cell of another fix runs the control's calls in both arms: it took the newer 26.4 s before."""
    _committed(tmp_path, "flux2", *(f"{name}__eager__full-4l-group_offload__h200" for name in (
        "group_offload_keep_host", "flux2_unpack_hw+group_offload_keep_host+hook_registry_cache+no_progress_bar+"
        "transformer_dtype")))
    basis = _estimate_of(tmp_path, 'pipeline = "flux2"\nsize = "full"\nlayers = 4\nmode = "eager"\n'
                                   'setting = "group_offload:block_level"\nfix = "hook_registry_cache"\n').basis
    assert basis.startswith("46,539 ms calls measured in group_offload_keep_host__"), basis


def test_a_compiled_ab_with_nothing_compiled_at_its_setting_is_estimated_from_its_eager_calls(tmp_path):
    """Nothing compiled measured yet in Wan's group offloading: the eager cells' calls (the offload's copies set
    them) and a compile's time, not a guessed minute a cell (42 min planned for its 8 cells, which take hours)."""
    cell = ('pipeline = "wan"\nsize = "full"\nlayers = 4\nmode = "compile"\nsetting = "group_offload:block_level"\n'
            'fix = "hook_registry_cache"\n')
    assert _estimate_of(tmp_path, cell).basis.startswith("guess: nothing measured at this setting")
    (eager,) = _committed(tmp_path, "wan", "group_offload_keep_host__eager__full-4l-group_offload__h200")
    estimate = _estimate_of(tmp_path, cell)
    assert estimate.basis.startswith("27,538 ms calls measured in group_offload_keep_host__eager__") and \
        "(eager: nothing compiled measured at this setting)" in estimate.basis, estimate.basis
    # its build, a compile, the eager result's set-up and profiled pair, and the calls compiling adds to the set-up:
    # one more warm-up call per arm and a counting call in the verification; the same for a compiled set over that
    # fix (planned from it as a result over some of its fixes) as for another fix alone
    measured = json.loads(eager.read_text())
    phases, call_s = measured["phase_s"], stats.median(
        [x for b in measured["samples"]["control"]["raw_wall_ms"] for x in b]) / 1e3
    pair_s = phases["profile"] / measured["profile"]["calls"]
    least = (measured["build_s"] + campaign.GUESS["compile"] + phases["warmup"] + phases["verify"] + 3 * call_s
             + pair_s)
    assert estimate.least == pytest.approx(least), estimate
    # a set over that fix, planned from it as a result over some of its fixes, makes its test arm's calls as that
    # fix's test arm did (the copies back gone): the two more test calls are those
    test_s = stats.median([x for b in measured["samples"]["test"]["raw_wall_ms"] for x in b]) / 1e3
    the_set = _estimate_of(tmp_path, cell.replace("hook_registry_cache", "group_offload_keep_host,hook_registry_cache"))
    assert the_set.least == pytest.approx(least - 2 * (call_s - test_s)), the_set
    # the eager result of the same fix is not the compiled cell's own on another GPU
    path = tmp_path / "c.toml"
    path.write_text("[campaign]\n[[cell]]\n" + cell.replace("hook_registry_cache", "group_offload_keep_host"))
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    basis = campaign.estimate(job, tmp_path, device="h100").basis
    assert basis.startswith("27,538 ms calls measured in group_offload_keep_host__eager__"), basis


@pytest.mark.parametrize("pipeline,layers,fixes", [
    ("ltx2", 8, "begin_index,group_offload_keep_host,hook_registry_cache,no_progress_bar"),
    ("wan", 4, "begin_index,group_offload_keep_host,hook_registry_cache,no_progress_bar,unipc_device_const,"
               "unipc_host_coeffs")])
def test_a_compiled_set_planned_from_eager_results_adds_the_calls_its_arms_make(tmp_path, pipeline, layers, fixes):
    """LTX2's and Wan's compiled group-offload sets, planned from `group_offload_keep_host` alone measured eager on the
    H200 host, then measured there (2026-11-28, committed): their warm-up and verification took 93.5 and 92.1 s. The
    calls compiling adds are one more warm-up call per arm and a counting call of the test arm, whose calls, with the
    copies back gone, take a fifth of the control's: counted as three control calls, the plan said about 150 s, and
    FLUX.1's and Qwen-Image's compiled jobs could not start in a lent call."""
    name = f"group_offload_keep_host__eager__full-{layers}l-group_offload__h200.json"
    (tmp_path / "ab" / pipeline).mkdir(parents=True)
    eager = json.loads((ROOT / "results/ab" / pipeline / name).read_text())
    (tmp_path / "ab" / pipeline / name).write_text(json.dumps(eager))
    planned = _estimate_of(tmp_path, f'pipeline = "{pipeline}"\nsize = "full"\nlayers = {layers}\nmode = "compile"\n'
                                     f'profile_calls = 1\nsetting = "group_offload:block_level"\nfix = "{fixes}"\n')
    setup = planned.again - eager["build_s"] - campaign.GUESS["compile"]  # its warm-up and verification
    compiled = json.loads((ROOT / "results/ab" / pipeline / f"{fixes.replace(',', '+')}__compile__full-{layers}l-"
                                                             "group_offload__h200.json").read_text())
    took = compiled["phase_s"]["warmup"] + compiled["phase_s"]["verify"]
    assert took < setup < 1.2 * took, (setup, took)
    control_s = stats.median([x for b in eager["samples"]["control"]["raw_wall_ms"] for x in b]) / 1e3
    assert eager["phase_s"]["warmup"] + eager["phase_s"]["verify"] + 3 * control_s > 1.5 * took  # as it was planned


def test_the_plan_estimates_as_a_run_on_the_gpu_it_is_given(tmp_path):
    """`lab campaign plan --gpu KIND` plans as `run` does on the GPU it finds: Qwen-Image's eager group-offload set,
    with `group_offload_keep_host` alone measured on an H100 host (kept in tests/data) and on an H200 one, is planned
    from the one measured on the GPU it will run on."""
    _committed(tmp_path, "qwenimage", *(f"group_offload_keep_host__eager__full-8l-group_offload__{gpu}"
                                        for gpu in ("h100", "h200")))
    fixes = "group_offload_keep_host,hook_registry_cache,no_progress_bar,qwen_modulate_index,qwen_rope_device"
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\n'
                    f'profile_calls = 1\nsetting = "group_offload:block_level"\nbudget = "25m"\nfix = "{fixes}"\n')
    for gpu in ("h100", "h200"):
        proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--gpu", gpu, "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        (job,) = json.loads(proc.stdout)["jobs"]
        assert f" s blocks from group_offload_keep_host__eager__full-8l-group_offload__{gpu}, over some of its " \
               "fixes" in job["basis"], job["basis"]
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--gpu", "a100")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"ERROR: `--gpu a100`: no A/B result under {tmp_path} was measured on such a GPU; the kinds there are h100, "
        "h200 (the tag that ends a result's name)."), proc.stderr[-1000:]


def test_a_compiled_job_planned_from_eager_results_takes_its_pipelines_compile_time(tmp_path):
    """Compiling's own time, where a compiled job is planned from eager results, is the most that a compiled A/B of
    its pipeline recorded (its arms' first calls): Wan's `begin_index` with the first-block cache compiled for 31.3 s
    on an H100 host, where the guess said 90 s."""
    cell = ('pipeline = "wan"\nsize = "full"\nlayers = 4\nmode = "compile"\nsetting = "group_offload:block_level"\n'
            'fix = "hook_registry_cache"\n')
    _committed(tmp_path, "wan", "group_offload_keep_host__eager__full-4l-group_offload__h200")
    guessed = _estimate_of(tmp_path, cell)
    (compiled,) = _committed(tmp_path, "wan", "begin_index__compile__full-4l-first_block_cache-threshold0.2__h100")
    arms = json.loads(compiled.read_text())["compilation"]
    seconds = arms["control"]["compile_s"] + arms["test"]["compile_s"]
    assert 30 < seconds < campaign.GUESS["compile"] / 2
    learned = _estimate_of(tmp_path, cell)
    assert learned.basis == guessed.basis  # planned from the same eager calls
    assert learned.least == pytest.approx(guessed.least - campaign.GUESS["compile"] + seconds), (learned, guessed)


def test_the_plan_says_how_many_blocks_would_decide_an_undecided_cell(tmp_path):
    """Qwen-Image's `hook_registry_cache` in model CPU offload on an H200 (kept in tests/data as it was: 34 blocks,
    1.0071, 95 % CI 0.9771-1.0301): a saving of milliseconds in 4.4 s calls that spread a few percent. At its estimate
    and interval, some 624 blocks would decide it, past the 40 of its design: the plan says so beside its blocks."""
    _committed(tmp_path, "qwenimage", "hook_registry_cache__eager__full-8l-model_cpu_offload__h200")
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
                    'mode = "eager"\nsetting = "model_cpu_offload"\nfix = "hook_registry_cache"\nbudget = "8m"\n')
    (status,) = campaign.status(campaign.load(path), tmp_path)
    assert status.state == "undecided" and not status.at_limit and status.past_design
    assert status.detail == ("34 blocks on h200; about 624 blocks would decide it if its estimate held, past its "
                             "design's 40"), status.detail
    # `run --redo-undecided --within-design` leaves it out: nothing to run
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--redo-undecided", "--within-design",
                    "--dry-run")
    assert proc.returncode == 0 and "lab.cli ab" not in proc.stdout, proc.stdout[-2000:]
    assert "leaving out 1 cell(s) likely past their design's most" in proc.stdout + proc.stderr
    # and `plan` with the same flags counts nothing; with `--redo-undecided` alone, its blocks so far and those left
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--redo-undecided", "--within-design")
    assert proc.returncode == 0 and "run as" not in proc.stdout, proc.stdout[-2000:]
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--redo-undecided")
    assert "and 1 undecided going on from their blocks run as 1 job(s)" in proc.stdout, proc.stdout[-2000:]
    assert "this cell's 34 blocks so far" in proc.stdout, proc.stdout[-2000:]
    assert "\nWithout the 1 cell(s) likely past their design's most (" in proc.stdout \
        and "), nothing is left to run.\n" in proc.stdout, proc.stdout[-2000:]


def test_the_plan_says_how_many_blocks_a_planned_cell_would_need_if_its_fixes_change_nothing(tmp_path):
    """Before a cell runs, the calls measured at its setting say how much its blocks will spread: Qwen-Image's
    control calls in model CPU offload spread 5.0 % against each other inside their blocks (34 blocks on an H200,
    kept in tests/data), so a fix of no effect there needs about 142 blocks to be found within ±1 %, past the
    design's 40. The plan says so beside the cell and counts it; a cell at a setting where nothing was measured, or
    of a fixed design, gets no such count."""
    _committed(tmp_path, "qwenimage", "hook_registry_cache__eager__full-8l-model_cpu_offload__h200")
    cell = 'pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\nfix = "no_progress_bar"\n'
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}setting = "model_cpu_offload"\n'
                    f'[[cell]]\n{cell}setting = "lora"\n'
                    f'[[cell]]\n{cell.replace("no_progress_bar", "qwen_rope_device")}setting = "model_cpu_offload"\n'
                    'blocks = 10\n')
    offload, lora, fixed = campaign.status(campaign.load(path), tmp_path)
    assert offload.state == "planned" and offload.past_design
    assert offload.detail == ("if its fixes change nothing, about 142 blocks would find that within ±1%, past its "
                              "design's 40 (calls spread 5.0% at this setting, 1 result)"), offload.detail
    assert (lora.detail, lora.past_design, fixed.detail) == ("", False, "")
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path))
    assert proc.returncode == 0 and "3 planned (1 likely past their design's most if their fixes change nothing)" \
        in proc.stdout, proc.stdout[-2000:]
    # and what the rest would take without it: the two other cells, each a job of its own (their settings differ)
    assert "run as 3 job(s)" in proc.stdout and re.search(
        r"\nWithout the 1 cell\(s\) likely past their design's most \(.*\), about [0-9.]+ (s|min|h) in 2 job\(s\)\.\n",
        proc.stdout), proc.stdout[-2000:]
    cells = json.loads(lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--json").stdout)["cells"]
    assert [c["past_design"] for c in cells] == [True, False, False], cells
    # `plan --within-design` counts what `run --within-design` runs: the other two
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--within-design", "--json")
    jobs = json.loads(proc.stdout)["jobs"]
    assert len(jobs) == 2 and not any("no_progress_bar" in j["command"] and "model_cpu_offload" in j["command"]
                                      for j in jobs), jobs
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--within-design")
    assert ", within their design's most blocks, run as 2 job(s)" in proc.stdout, proc.stdout[-2000:]
    assert "\nWithout the " not in proc.stdout, proc.stdout[-2000:]
    # `run --within-design` leaves that cell out and runs the other two
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--within-design", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = [line for line in proc.stdout.splitlines() if "lab.cli ab" in line]
    assert "leaving out 1 cell(s) likely past their design's most" in proc.stdout + proc.stderr
    assert len(commands) == 2 and not any("no_progress_bar" in c and "model_cpu_offload" in c for c in commands), \
        commands
    # without it, under a time limit, that cell's job goes last, though it fits the limit as the others do
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--dry-run", "--time-limit", "10h")
    commands = [line for line in proc.stdout.splitlines() if "lab.cli ab" in line]
    assert len(commands) == 3 and "--fix no_progress_bar " in commands[-1] and "model_cpu_offload" in commands[-1], \
        commands
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}setting = "model_cpu_offload"\n')  # that cell alone
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--within-design", "--dry-run")
    assert proc.returncode == 0 and "lab.cli ab" not in proc.stdout, proc.stdout[-2000:]
    assert "every cell left to run is past its design's most; nothing to run" in proc.stdout + proc.stderr


def test_an_undecided_ab_is_estimated_from_its_own_blocks_and_starts_under_a_limit_it_does_not_fit(tmp_path):
    """Qwen-Image in group offloading on an H200 (its result as committed when undecided, kept in tests/data: 4 blocks
    of 81 to 126 s, budget spent, its profiles kept): afresh, the cell's own set-up and block times say what it takes; going on (`--redo-undecided`),
    only the blocks it has left and its set-up count, and under a limit that its whole run does not fit it still
    starts, since it stops its blocks before the limit and keeps them. One that cannot do even one block is not."""
    measured = _undecided("qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h200.json")
    (tmp_path / "ab" / "qwenimage").mkdir(parents=True)
    for gpu in ("h100", "h200"):  # the H100's 3 blocks first, then the H200's 4: the newest is the H200's
        source = measured.with_name(measured.name.replace("h200", gpu))
        (tmp_path / "ab" / "qwenimage" / source.name).write_bytes(source.read_bytes())
        time.sleep(0.01)
    blocks = json.loads(measured.read_text())["block_s"]
    path = tmp_path / "c.toml"
    cell = ('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
            'mode = "eager"\nsetting = "group_offload:block_level"\nfix = "group_offload_keep_host"\nbudget = "{}"\n')
    path.write_text(cell.format("14m"))
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    fresh, going_on = campaign.estimate(job, tmp_path), campaign.estimate(job, tmp_path, resume=True)
    assert f"{sorted(blocks)[2] / 2 + sorted(blocks)[1] / 2:,.0f} s blocks measured in {measured.stem}" in fresh.basis
    assert going_on.basis.startswith("this cell's 4 blocks so far")
    assert going_on.seconds < fresh.seconds and going_on.least < fresh.least  # its profiles are kept
    assert fresh.warning is None and going_on.warning is None
    # on a given GPU, the cell's own result is the one measured there: the only one a run there can go on from
    assert [campaign.blocks_on(job.cells[0], tmp_path, gpu) for gpu in ("h100", "h200", "a100")] == [3, 4, 0]
    assert campaign.estimate(job, tmp_path, resume=True, device="h100").basis.startswith("this cell's 3 blocks")
    # on a GPU with none of its own, its blocks on another (the newest) time what its run will, scaled to the calls
    assert ", this cell on another GPU, at " in campaign.estimate(job, tmp_path, resume=True, device="a100").basis
    path.write_text(cell.format("2m"))  # 4 blocks and one more are not the 8 the rule needs to call a change
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    assert "stops after about 5 block(s)" in campaign.estimate(job, tmp_path, resume=True).warning
    # two cells of other fixes, planned alike from it: their one reason is said once, with how many share it
    path.write_text(cell.replace('"group_offload_keep_host"', '["hook_registry_cache", "no_progress_bar"]').format("5m"))
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    short = campaign.estimate(job, tmp_path).warning
    assert ": 2 cells: at 168 s per block" in short and short.count("fewer than the 7 the rule needs") == 1, short
    path.write_text(cell.format("14m"))
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--json")
    (planned,) = json.loads(proc.stdout)["cells"]  # which GPU can go on from which blocks
    assert planned["state"] == "undecided" and planned["detail"] == "4 blocks on h200, 3 on h100", planned
    # `plan` counts what `run` would run: nothing owed, unless it goes on from its blocks (`--redo-undecided`)
    assert "run as" not in lab_here("campaign", "plan", str(path), "--results", str(tmp_path)).stdout
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--redo-undecided", "--gpu", "h200",
                    "--time-limit", "8m")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "The 0 cells without a result (or with one of the old build, or a census without a new fix) and 1 " \
        "undecided going on from their blocks run as 1 job(s)" in proc.stdout, proc.stdout[-2000:]
    assert ": about " in proc.stdout and "(this cell's 4 blocks so far, " in proc.stdout, proc.stdout[-2000:]
    assert "In runs of 8 min on one worker" in proc.stdout, proc.stdout[-2000:]
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--redo-undecided", "--time-limit",
                    "8m", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--resume --replace" in proc.stdout and proc.stdout.rstrip().endswith(
        "would start and stop its blocks at the limit"), proc.stdout
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--redo-undecided", "--time-limit",
                    "3m", "--dry-run")
    assert proc.stdout.rstrip().endswith("would not start within the limit"), proc.stdout


def test_a_calibration_under_a_limit_it_does_not_fit_starts_when_one_trial_fits(tmp_path):
    """The cross-process calibration (`campaigns/processes.toml`: 8 minutes a run) keeps each trial as it ends and
    starts none that would end past the limit, so a limit shorter than its run still starts it where its longest
    trial so far fits (the committed H200 file: 20 trials of 73 to 117 s); a GPU without trials of its own, or a
    limit that one trial does not fit, does not."""
    measured = ROOT / "results/calibration/wan__eager__tiny__h200__processes.json"
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / measured.name).write_bytes(measured.read_bytes())
    longest = max(t["seconds"] for t in json.loads(measured.read_text())["trials"]["aa"])
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\nkind = "calibrate"\npipeline = "wan"\nsize = "tiny"\n'
                    'isolate = true\npositive = false\ntrials = 40\nmax_blocks = 12\nminutes = 8\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    on_h200, on_h100 = (campaign.estimate(job, tmp_path, device=gpu) for gpu in ("h200", "h100"))
    assert on_h200.seconds == on_h100.seconds == 480.0 and on_h200.unit == "trial"
    assert on_h200.least == pytest.approx(campaign.GUESS["build"]["tiny"] + longest) and on_h100.least is None
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--time-limit", "5m", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("would start and stop its trials at the limit"), proc.stdout
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--time-limit", "2m", "--dry-run")
    assert proc.stdout.rstrip().endswith("would not start within the limit"), proc.stdout


def test_release_cells_are_named_planned_and_run_as_their_commands_name_them(tmp_path):
    """`campaigns/releases.toml` over the committed results, measured on the faithful build with fresh pairs
    (H200, 2026-11-26), and over the same results as the old build wrote them (no build recorded, the pair of two
    diffusers of one worker pair): those are owed; a history goes on by itself (no `--replace`: it keeps the pairs
    of its build and design), the A/Bs are measured afresh. A history made anew with fresh pairs is measured; one
    stopped before its releases is owed; one whose pairs ran as one pair is."""
    plan = campaign.load(ROOT / "campaigns" / "releases.toml")
    stems = [c.stem("h200") for c in plan.cells]
    assert stems == ["wan__eager__full-2l__h200", "patch-wan_contiguous__eager__full-2l__h200",
                     "patch-wan_contiguous__eager__full-4l__h200", "diffusers-0.37.1-to-0.38.0__eager__full-4l__h200"]
    assert [s.state for s in campaign.status(plan, ROOT / "results")] == ["measured"] * 4
    old = tmp_path / "old"
    for cell in plan.cells:
        (found,) = cell.results_found(ROOT / "results", "cuda")
        data = json.loads(found.read_text())
        data.pop("build")
        if data.get("workers"):
            data["workers"] = {**data["workers"], "design": "one pair"}
        target = old / found.relative_to(ROOT / "results")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data))
    assert [s.state for s in campaign.status(plan, old)] == ["old build"] * 4
    jobs = campaign.jobs(list(plan.cells))
    assert [j.id for j in jobs] == ["history-wan-eager-full-2l-releases", "ab-wan-eager-full-2l-patch-wan_contiguous",
                                    "ab-wan-eager-full-4l-patch-wan_contiguous",
                                    "ab-wan-eager-full-4l-diffusers-0.37.1-to-0.38.0"]
    proc = lab_here("campaign", "run", str(ROOT / "campaigns" / "releases.toml"), "--results", str(old), "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    history, *abs_ = proc.stdout.splitlines()
    assert f" history --pipeline wan --out {old}/history --ab-out {old}/ab " in history
    assert "--replace" not in history and all(line.split("    #")[0].endswith("--replace") for line in abs_)
    assert "--patch patches/changes/wan_contiguous.diff" in abs_[0] and "--test-diffusers 0.38.0" in abs_[2]

    # a history of its own in a results folder: measured, stopped before its releases, or of one pair
    committed = json.loads((ROOT / "results/history/wan__eager__full-2l__h200.json").read_text())
    (tmp_path / "history").mkdir()
    page = tmp_path / "history" / "wan__eager__full-2l__h200.json"
    one = campaign.load(ROOT / "campaigns" / "releases.toml")
    one = campaign.Campaign(one.path, one.description, one.device, one.cells[:1], {})

    def state_of(rows):
        page.write_text(json.dumps({**committed, "build": "faithful", "releases": rows}))
        (status,) = campaign.status(one, tmp_path)
        return status.state, status.verdict

    fresh = [{**r, "processes": "fresh pair per block"} if r["status"] == "measured" else r
             for r in committed["releases"]]
    assert state_of(fresh) == ("measured", "measured")
    stopped = fresh[:4] + [{"version": v, "status": "not reached", "why": "the campaign's time limit came first"}
                           for v in ("0.40.0", "0.41.0", "0.42.1")]
    assert state_of(stopped) == ("planned", "interrupted, 3 of 6 releases to go")
    assert state_of([{**r, "processes": "one pair"} if r["status"] in ("measured", "kept") else r
                     for r in committed["releases"]]) == ("one pair", "one pair")
    estimate = campaign.estimate(campaign.jobs(list(one.cells))[0], tmp_path, device="h200")
    assert estimate.unit == "release" and estimate.least == pytest.approx(
        campaign.GUESS["build"]["full"] + committed["seconds"] / 3)  # its last run measured 3 pairs and kept 3


def test_undecided_cells_that_can_go_on_from_blocks_on_this_gpu_run_first(tmp_path, monkeypatch, capsys):
    """On an H100 host, `--redo-undecided` runs first the cell whose blocks were measured on an H100 (Qwen-Image, 3
    blocks), then the one whose blocks are on an H200 only (LTX2, which starts afresh here), whatever the file's
    order; `--only` keeps the order it is given."""
    from lab import cli

    for pipeline, gpu in (("ltx2", "h200"), ("qwenimage", "h100")):
        name = f"group_offload_keep_host__eager__full-8l-group_offload__{gpu}.json"
        (tmp_path / "ab" / pipeline).mkdir(parents=True)
        (tmp_path / "ab" / pipeline / name).write_bytes(_undecided(pipeline, name).read_bytes())
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = ["ltx2", "qwenimage"]\nsize = "full"\n'
                    'layers = 8\nmode = "eager"\nsetting = "group_offload:block_level"\n'
                    'fix = "group_offload_keep_host"\nbudget = "10m"\n')
    # the host's GPU is asked of nvidia-smi (no CUDA context in the campaign's process); none on a CPU host
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\necho 'NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert cluster.gpu_tag("cuda") == "h100" and cluster.gpu_tag("cpu") is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert cluster.gpu_tag("cuda") is None
    monkeypatch.setattr(cluster, "gpu_tag", lambda device: "h100")
    run = ["campaign", "run", str(path), "--results", str(tmp_path), "--redo-undecided", "--dry-run"]
    assert cli.main(run) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "--pipeline qwenimage" in first and "--pipeline ltx2" in second
    assert cli.main(run + ["--only", "ltx2", "--only", "qwenimage"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "--pipeline ltx2" in first and "--pipeline qwenimage" in second


def test_undecided_cells_past_their_design_run_after_the_others(tmp_path, monkeypatch, capsys):
    """On an H200 host both cells can go on from H200 blocks, but Qwen-Image's `hook_registry_cache` in model CPU
    offload (34 blocks, about 624 needed) would need more than its design's 40: `--redo-undecided` runs it after
    `group_offload_keep_host` in group offloading (4 blocks, a change of 5x), though the file lists it first."""
    from lab import cli

    _committed(tmp_path, "qwenimage", "hook_registry_cache__eager__full-8l-model_cpu_offload__h200",
               "group_offload_keep_host__eager__full-8l-group_offload__h200")
    path = tmp_path / "c.toml"
    cell = ('[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\nsetting = "{}"\n'
            'fix = "{}"\nbudget = "10m"\n')
    path.write_text('[campaign]\ndevice = "cuda"\n' + cell.format("model_cpu_offload", "hook_registry_cache")
                    + cell.format("group_offload:block_level", "group_offload_keep_host"))
    plan = campaign.load(path)
    assert [campaign.past_its_design(c, tmp_path, "h200") for c in plan.cells] == [True, False]
    monkeypatch.setattr(cluster, "gpu_tag", lambda device: "h200")
    assert cli.main(["campaign", "run", str(path), "--results", str(tmp_path), "--redo-undecided", "--dry-run"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "--fix group_offload_keep_host" in first and "--fix hook_registry_cache" in second


def test_a_time_limit_is_for_jobs_run_here(tmp_path):
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--time-limit", "10m", "--slurm", "2")
    assert proc.returncode == 2 and "`--time-limit` runs the jobs on this host, not on 2 Slurm job(s)" in proc.stderr
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--gpus", "0,0")
    assert proc.returncode == 2 and "`--gpus 0,0`: expected `all` or distinct GPU numbers" in proc.stderr
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--time-limit", "soon")
    assert proc.returncode == 2 and "`--time-limit soon`: `soon`: expected a positive time" in proc.stderr


@pytest.mark.parametrize("option, message", [
    ("blokcs = 3", "unrecognized arguments: --blokcs 3"),
    ("blocks = 'many'", "argument --blocks: invalid int value: 'many'"),
    ("mode = 'fast'", "argument --mode: invalid choice: 'fast'"),
])
def test_options_a_subcommand_refuses_are_found_before_anything_runs(tmp_path, option, message):
    from lab.commands.campaign import check_options

    path = tmp_path / "bad.toml"
    path.write_text(f"[campaign]\ndevice = 'cpu'\n[[cell]]\npipeline = 'wan'\nfix = 'unipc_stack'\nsize = 'tiny'\n{option}\n")
    with pytest.raises(UsageError, match=re.escape(message)) as refused:
        check_options(campaign.load(path))
    assert "[[cell]] number 1" in str(refused.value)


def test_run_checks_the_options_before_anything_runs(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[campaign]\ndevice = 'cpu'\n[[cell]]\npipeline = 'wan'\nfix = 'unipc_stack'\nsize = 'tiny'\n"
                    "blokcs = 3\n")
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path))
    assert proc.returncode == 2 and "unrecognized arguments: --blokcs 3" in proc.stderr, proc.stderr[-2000:]
    assert "Full traceback" not in proc.stderr and not (tmp_path / "logs").exists()


def test_a_cell_in_a_setting_its_pipeline_cannot_take_is_refused_before_anything_runs(tmp_path):
    """As `lab` refuses the setting before a build, the campaign refuses the cell before any job: pyramid attention
    broadcast on Wan, whose separate guidance calls would share one attention cache (`lab settings`)."""
    path = tmp_path / "pab.toml"
    path.write_text("[campaign]\ndevice = 'cuda'\n[[cell]]\nkind = 'census'\npipeline = ['flux', 'wan']\n"
                    "setting = 'pyramid_attention_broadcast'\n")
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path))
    # (transformers' own notes that torchvision is missing here, which a machine with torchvision does not print, aside)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("[transformers]")]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("ERROR: "), proc.stderr[-2000:]
    assert "[[cell]] number 1 (census wan" in proc.stderr
    assert "`--setting pyramid_attention_broadcast` cannot run on `wan`: pyramid attention broadcast keeps one" in proc.stderr
    path.write_text(path.read_text().replace("['flux', 'wan']", "'flux'"))  # FLUX.1 runs no guidance branch
    assert lab_here("campaign", "plan", str(path), "--results", str(tmp_path)).returncode == 0


def test_only_that_matches_no_cell_is_an_error(tmp_path):
    proc = lab_here("campaign", "run", str(TINY), "--results", str(tmp_path), "--only", "no such cell")
    assert proc.returncode == 2 and "matches none of the 4 cells" in proc.stderr, proc.stderr[-2000:]


def test_a_setting_that_needs_a_package_this_host_lacks_is_planned_here_and_refused_where_it_runs(tmp_path):
    """torchao is not in the lab's environment: `--setting quantized` is refused here at once (`lab run`), yet a GPU
    campaign with it plans on this machine, since the host that runs it may have the package (a pipeline that cannot
    take a setting is refused when planning, as before)."""
    assert importlib.util.find_spec("torchao") is None
    path = tmp_path / "q.toml"
    path.write_text('[campaign]\ndescription = "q"\n\n[[cell]]\nkind = "census"\npipeline = "wan"\n'
                    'setting = "quantized"\n')
    plan = lab_here("campaign", "plan", str(path), "--results", str(tmp_path))
    assert plan.returncode == 0 and "census wan eager, setting quantized" in plan.stdout, plan.stderr[-2000:]
    refused = lab_here("census", "--pipeline", "wan", "--setting", "quantized", "--out", str(tmp_path / "census"))
    assert "torchao is not installed (`pip install torchao`)" in refused.stderr + refused.stdout


def test_an_ab_in_a_setting_not_measured_yet_starts_under_a_limit_from_the_calls_without_it(tmp_path):
    """A set of every fix in a setting with no A/B at that setting yet (Qwen-Image's LoRA, 8 blocks) has only a
    guess for its whole run, but its shortest useful run (set-up and one profiled pair) comes from the calls
    the same pipeline made without the setting: under a limit its guess does not fit it still starts, and stops its
    blocks at the limit. Without any result of the pipeline, a guessed minute stands for that run."""
    plain = ROOT / "results/ab/qwenimage/hook_registry_cache__eager__full-8l__h200.json"
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
                    'mode = "eager"\nsetting = "lora:rank=16"\nfix = "hook_registry_cache"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    blind = campaign.estimate(job, tmp_path)
    assert blind.basis == "guess: nothing measured at this setting"
    assert blind.least == campaign.GUESS["build"]["full"] + campaign.GUESS["block"]
    (tmp_path / "ab" / "qwenimage").mkdir(parents=True)
    (tmp_path / "ab" / "qwenimage" / plain.name).write_bytes(plain.read_bytes())
    seen = campaign.estimate(job, tmp_path)
    data = json.loads(plain.read_text())["samples"]
    calls = sorted(x for b in data["control"]["raw_wall_ms"] for x in b)  # the control arm's calls
    median_s = (calls[len(calls) // 2] if len(calls) % 2 else (calls[len(calls) // 2 - 1] + calls[len(calls) // 2]) / 2) / 1e3
    assert seen.seconds == blind.seconds and seen.basis == blind.basis  # the whole run is still a guess
    assert seen.least == pytest.approx(campaign.GUESS["build"]["full"] + (4 + 6) * median_s)  # set-up, profiled pair
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--time-limit", "3m", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("would start and stop its blocks at the limit"), proc.stdout


def test_an_ab_that_timed_no_block_plans_the_next_run_from_its_call_time(tmp_path):
    """A run cut off before any block (Flux2 Klein in group offloading: an 82 s call) keeps the time of its plain
    calls (`phase_s["call"]`): the next plan estimates from it, and a time limit it cannot fit starts nothing."""
    plain = json.loads((ROOT / "results/ab/qwenimage/hook_registry_cache__eager__full-8l__h200.json").read_text())
    plain.update(samples=None, order=[], profile=None, stats=None, looks=None, block_s=None, verdict="no data",
                 stopped="time limit", phase_s={"warmup": 170.0, "verify": 164.0, "call": 82.0})
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
                    'mode = "eager"\nfix = "hook_registry_cache"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    blind = campaign.estimate(job, tmp_path)
    (tmp_path / "ab" / "qwenimage").mkdir(parents=True)
    (tmp_path / "ab" / "qwenimage" / "hook_registry_cache__eager__full-8l__h100.json").write_text(json.dumps(plain))
    seen = campaign.estimate(job, tmp_path)
    assert blind.basis.startswith("guess") and seen.basis.startswith("410 s blocks measured in"), seen.basis
    # its build and set-up as measured and one profiled pair (the profiler slows ~3x): a run cut off after the pair
    # keeps it, and the next goes on to the blocks
    assert seen.least == pytest.approx(plain["build_s"] + 170.0 + 164.0 + 6 * 82.0)
    proc = lab_here("campaign", "run", str(path), "--results", str(tmp_path), "--time-limit", "9m", "--dry-run",
                    "--redo-undecided")
    assert proc.returncode == 0 and "would not start within the limit" in proc.stdout, proc.stdout + proc.stderr


def test_a_cells_newest_result_is_the_one_measured_last_whatever_the_files_times(tmp_path):
    """A clone or a tarball gives files arbitrary modification times: a cell measured on two kinds of GPU once read
    its older, undecided result as its newest in a clean clone of main, and `lab table` counted it undecided. The
    order is the `created` time each result records (the modification time only where a file records none)."""
    from lab.base import files

    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\npipeline = "wan"\nfix = "unipc_stack"\nsize = "full"\nlayers = 4\n')
    (cell,) = campaign.load(path).cells
    folder = cell.folder(tmp_path)
    folder.mkdir(parents=True)
    stored = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    older, newer = (folder / f"{cell.stem(card)}.json" for card in ("h200", "h100"))
    older.write_text(json.dumps({**stored, "created": "2026-11-26T10:00:00Z", "verdict": "undecided"}, indent=1))
    newer.write_text(json.dumps({**stored, "created": "2026-11-27T10:00:00Z", "verdict": "faster"}, indent=1))
    os.utime(older, (2e9, 2e9))  # the older result's file looks the newer
    os.utime(newer, (1e9, 1e9))
    assert cell.results_found(tmp_path, "cuda") == [older, newer]
    (state,) = campaign.status(campaign.load(path), tmp_path)
    assert (state.state, state.result) == ("measured", newer)
    undated = tmp_path / "undated.json"
    undated.write_text('{"kind": "ab"}')
    os.utime(undated, (1.5e9, 1.5e9))  # 2017: before both results' `created`
    assert files.newest_last([newer, undated, older]) == [undated, older, newer]


def test_a_planned_cell_whose_fixes_changed_the_call_in_the_other_mode_is_not_counted_past_its_design(tmp_path):
    """Qwen-Image's compiled set in model CPU offload (its calls spread 4.7 % in their blocks) puts a fix of no
    effect there at about 128 blocks, past the design's 40. `model_offload_keep_host` is no such fix: in eager, at
    the same setting, it ran 0.2345x the control's time, and a change that large decides in a few blocks. The plan
    says so beside that cell and does not count it past its design; `hook_registry_cache`, undecided in eager, it
    still counts."""
    _committed(tmp_path, "qwenimage", "hook_registry_cache+model_offload_keep_host+no_progress_bar+qwen_modulate_index"
               "+qwen_rope_device__compile__full-8l-model_cpu_offload__h100",
               "model_offload_keep_host__eager__full-8l-model_cpu_offload__h100",
               "hook_registry_cache__eager__full-8l-model_cpu_offload__h100")
    cell = 'pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "compile"\nsetting = "model_cpu_offload"\n'
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}fix = "model_offload_keep_host"\n'
                    f'[[cell]]\n{cell}fix = "hook_registry_cache"\n')
    keep_host, hooks = campaign.status(campaign.load(path), tmp_path)
    assert keep_host.state == "planned" and not keep_host.past_design, keep_host
    assert keep_host.detail.startswith("if its fixes change nothing, about 128 blocks would find that within ±1%, "
                                       "past its design's 40") and keep_host.detail.endswith(
        "; but in eager they ran 0.2345x the control's time (model_offload_keep_host__eager__full-8l-model_cpu_"
        "offload__h100.json): a change decides sooner"), keep_host.detail
    assert hooks.state == "planned" and hooks.past_design and "but in eager" not in hooks.detail, hooks


def test_a_planned_set_holding_a_fix_that_changed_the_call_is_not_counted_past_its_design(tmp_path):
    """The same compiled setting: a set of `model_offload_pinned` and `hook_registry_cache` has no result, and a fix
    of no effect there would need over a hundred blocks; but `model_offload_pinned` alone, at the same pipeline, mode,
    depth and setting, ran 0.0594x the control's time, so the set is unlikely to change nothing, and the plan does not
    count it past its design. A set none of whose parts was measured changing the call (`hook_registry_cache` with
    `no_progress_bar`: no result of either there) it still counts."""
    _committed(tmp_path, "qwenimage", "hook_registry_cache+model_offload_keep_host+no_progress_bar+qwen_modulate_index"
               "+qwen_rope_device__compile__full-8l-model_cpu_offload__h100",
               "model_offload_pinned__compile__full-8l-model_cpu_offload__h200")
    cell = 'pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "compile"\nsetting = "model_cpu_offload"\n'
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}fix = "hook_registry_cache,model_offload_pinned"\n'
                    f'[[cell]]\n{cell}fix = "hook_registry_cache,no_progress_bar"\n')
    pinned, hooks = campaign.status(campaign.load(path), tmp_path)
    assert pinned.state == "planned" and not pinned.past_design, pinned
    assert pinned.detail.endswith("; but with model_offload_pinned alone they ran 0.05941x the control's time "
                                  "(model_offload_pinned__compile__full-8l-model_cpu_offload__h200.json): a change "
                                  "decides sooner"), pinned.detail
    assert hooks.state == "planned" and hooks.past_design and "alone they ran" not in hooks.detail, hooks


def test_the_plan_says_where_a_cell_within_its_design_needs_more_blocks_than_its_budget_buys(tmp_path):
    """Qwen-Image's eager group-offload control calls (H100 and H200, committed) spread about 2 % against each other,
    so a fix of no effect there needs about 26 blocks to be found within ±1 %, within the design's 40; but a budget of
    30 minutes, which counts one run's blocks, buys about 9 blocks of five 38 s calls. The plan says it ends
    undecided at its budget and how many runs `--redo-undecided` takes; with a budget that buys them, nothing."""
    _committed(tmp_path, "qwenimage", "group_offload_keep_host__eager__full-8l-group_offload__h100",
               "group_offload_keep_host__eager__full-8l-group_offload__h200")
    cell = 'pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "eager"\nsetting = "group_offload"\n' \
           'fix = "no_progress_bar"\n'
    path = tmp_path / "c.toml"
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}budget = "30m"\n[[cell]]\n{cell}budget = "3h"\n'
                    f'[[cell]]\n{cell}')
    short, long, unbounded = campaign.status(campaign.load(path), tmp_path)
    assert short.state == "planned" and not short.past_design, short
    blocks = int(re.search(r"about (\d+) blocks would find", short.detail)[1])
    buys = re.search(r"; its budget of 30m buys about (\d+) such blocks of ([\d,]+) s, so it ends undecided at its "
                     r"budget and `run --redo-undecided` goes on from its blocks, about (\d+) runs in all$", short.detail)
    assert buys and 6 < int(buys[1]) < blocks <= 40 and int(buys[3]) == math.ceil(blocks / int(buys[1])), short.detail
    assert long.detail == unbounded.detail == short.detail[:short.detail.index("; its budget")], (long, unbounded)
    # the GPU time of its further runs, which a plan counting one budget a cell leaves out, and says so
    block_s = float(buys[2].replace(",", ""))
    assert short.beyond_budget_s == pytest.approx((blocks - int(buys[1])) * block_s, rel=0.01)
    assert long.beyond_budget_s == unbounded.beyond_budget_s == 0


def test_a_fix_that_includes_another_holds_its_measured_change(tmp_path):
    """`group_offload_pinned` makes `group_offload_keep_host`'s change and more (`Fix.includes`): at Qwen-Image's
    compiled group offload (H200, committed), where keep-host alone ran 0.16x the control's time, a cell of the pinned
    fix alone is planned neither past its design nor past its 30-minute budget, as a fix of no effect there would be
    (`no_progress_bar`, above), and the plan names keep-host's result as why."""
    _committed(tmp_path, "qwenimage", "group_offload_keep_host__compile__full-8l-group_offload__h200",
               "qwen_modulate_index__compile__full-8l-group_offload__h200")
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
                    'mode = "compile"\nsetting = "group_offload"\nbudget = "30m"\nfix = "group_offload_pinned"\n')
    (pinned,) = campaign.status(campaign.load(path), tmp_path)
    assert pinned.state == "planned" and not pinned.past_design and not pinned.beyond_budget_s, pinned
    assert re.search(r"; past its budget if its fixes change nothing, but with group_offload_keep_host alone they ran "
                     r"0\.\d+x the control's time \(group_offload_keep_host__compile__full-8l-group_offload__h200\.json\)"
                     r": a change decides sooner$", pinned.detail), pinned.detail


def test_a_fix_may_include_only_a_fix_it_conflicts_with(monkeypatch):
    """Two fixes of which one makes the other's change rewrite the same code: both cannot be on, so a fix that
    names another in `includes` but not in `conflicts` is an error naming the file."""
    import dataclasses

    from lab.apply import fix as fix_module
    from lab.base.errors import LabError

    found = fix_module.discover
    monkeypatch.setattr(fix_module, "discover", lambda *args: [
        (m, dataclasses.replace(f, conflicts=()) if m == "model_offload_pinned" else f) for m, f in found(*args)])
    fix_module.catalog.cache_clear()
    try:
        with pytest.raises(LabError, match=r"`fixes/model_offload_pinned\.py` includes `model_offload_keep_host` "
                                           r"without conflicting with it"):
            fix_module.catalog()
    finally:
        monkeypatch.undo()
        fix_module.catalog.cache_clear()
    assert fix_module.catalog()["model_offload_pinned"].includes == ("model_offload_keep_host",)


def test_a_cell_whose_fix_never_ran_at_its_setting_is_planned_to_settle_at_one_block(tmp_path):
    """Whether a fix's code runs is its scenario's: Qwen-Image's compiled set in model CPU offload (H100, committed)
    ran `qwen_modulate_index` 0 times, so that fix alone there settles as not exercised at its first block (`lab ab`
    stops there and takes no profiles). The plan neither counts it past its design's most blocks, as the calls'
    spread would for a fix of no effect, nor plans it at its budget; another fix at the same setting it still does."""
    _committed(tmp_path, "qwenimage", "hook_registry_cache+model_offload_keep_host+no_progress_bar+qwen_modulate_index"
               "+qwen_rope_device__compile__full-8l-model_cpu_offload__h100")
    path = tmp_path / "c.toml"
    cell = 'pipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "compile"\nsetting = "model_cpu_offload"\n' \
           'budget = "9m"\n'
    path.write_text(f'[campaign]\ndevice = "cuda"\n[[cell]]\n{cell}fix = "qwen_modulate_index"\n'
                    f'[[cell]]\n{cell}fix = "qwen_rope_device"\n')
    unrun, other = campaign.status(campaign.load(path), tmp_path)
    assert (unrun.state, unrun.past_design, other.past_design) == ("planned", False, True), (unrun, other)
    assert unrun.detail.endswith("; but qwen_modulate_index never ran in hook_registry_cache+model_offload_keep_host+"
                                 "no_progress_bar+qwen_modulate_index+qwen_rope_device__compile__full-8l-"
                                 "model_cpu_offload__h100.json: it settles as not exercised at its first block at "
                                 "most"), unrun.detail
    first, second = (campaign.estimate(job, tmp_path) for job in campaign.jobs(list(campaign.load(path).cells)))
    assert "at most 1 blocks per cell" in first.basis and "at most 1 blocks" not in second.basis, (first, second)
    assert first.seconds < second.seconds / 4, (first, second)
    # its shortest useful run is its build and set-up: where a time limit leaves no room for its block, it settles
    # without one; the other cell's takes its first profiled pair too
    assert first.least == first.again < first.seconds and second.least > second.again, (first, second)


def test_a_cell_of_no_effect_takes_its_set_up_from_a_result_whose_arms_ran_alike(tmp_path):
    """Qwen-Image's compiled group-offload cells of one fix (H200, committed): planned as fixes of no effect, both arms
    at the control's 40 s calls. Their set-up came from `group_offload_keep_host`'s, whose test arm took 6 s calls,
    184 s; `qwen_modulate_index`, which never ran, took 318 s for the same warm-up and verification of two slow arms.
    Planned from that one, a run going on spends about 5 minutes again and a 200 s block does not fit after it in an
    8-minute run: the plan says that job gets no further there."""
    from lab.campaigns import windows

    _committed(tmp_path, "qwenimage", "group_offload_keep_host__compile__full-8l-group_offload__h200")
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\ndevice = "cuda"\n[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\n'
                    'mode = "compile"\nsetting = "group_offload"\nfix = "hook_registry_cache"\nbudget = "30m"\n')
    (job,) = campaign.jobs(list(campaign.load(path).cells))
    fast = campaign.estimate(job, tmp_path, device="h200")
    _committed(tmp_path, "qwenimage", "qwen_modulate_index__compile__full-8l-group_offload__h200")
    slow = campaign.estimate(job, tmp_path, device="h200")
    assert fast.again < 200 < 280 < slow.again < 340 and 180 < slow.step < 220, (fast, slow)
    runs = windows.runs_needed([job.id], {job.id: slow}, 505)
    assert runs.stuck == [job.id], runs
    proc = lab_here("campaign", "plan", str(path), "--results", str(tmp_path), "--time-limit", "505s", "--gpu", "h200")
    assert proc.returncode == 0 and "1 job(s) start in such a run but get no further in the next" in proc.stdout \
        and re.search(r"a run going on spends about 5 min again before its first block of about 3 min", proc.stdout), \
        proc.stdout[-2000:]



def test_a_compiled_run_going_on_is_planned_without_the_verification_it_keeps(tmp_path):
    """Qwen-Image's compiled `group_offload_keep_host` (H200, committed, here as if a time limit had stopped it): its
    verifying calls compiled nothing after its warm-up, so a run going on from its blocks keeps the verification
    (`kept_verification`) and the plan counts that run's set-up as the warm-up alone; where they compiled something,
    it verifies again and the plan counts both. A cell planned from it keeps the verification in its runs going on,
    not in its first."""
    (copy,) = _committed(tmp_path, "qwenimage", "group_offload_keep_host__compile__full-8l-group_offload__h200")
    data = json.loads(copy.read_text())
    assert data["compilation"]["verify"]["compilations"] == 0 and data["phase_s"]["verify"] > 30
    path = tmp_path / "c.toml"
    cell = ('[[cell]]\npipeline = "qwenimage"\nsize = "full"\nlayers = 8\nmode = "compile"\nsetting = "group_offload"'
            '\nbudget = "30m"\nfix = "{}"\n')
    path.write_text('[campaign]\ndevice = "cuda"\n' + cell.format("group_offload_keep_host")
                    + cell.format("hook_registry_cache"))
    own, other = campaign.jobs(list(campaign.load(path).cells))
    times = {}
    for compiled in (0, 3):
        copy.write_text(json.dumps(as_undecided(data, stopped="time limit", compilation={
            **data["compilation"], "verify": {"compilations": compiled}})))
        times[compiled] = [campaign.estimate(job, tmp_path, resume=True, device="h200") for job in (own, other)]
    (kept, planned), (verified, planned_again) = times[0], times[3]
    assert kept.again == pytest.approx(verified.again - data["phase_s"]["verify"]), (kept, verified)
    assert kept.least == pytest.approx(verified.least - data["phase_s"]["verify"]), (kept, verified)
    assert planned.least == planned_again.least and planned.again < planned_again.again, (planned, planned_again)


def test_each_job_learns_how_many_jobs_measure_at_once_on_its_host(tmp_path, monkeypatch):
    """A campaign tells each job how many jobs its host measures at once (`LAB_HOST_JOBS`: its workers times the
    campaigns `campaigns/device.sh` runs side by side, `LAB_HOST_CAMPAIGNS`), and each result records it
    (`environment.host_jobs`): four campaigns side by side slowed each other's offloaded control calls, or their host
    did, and the results could not say which (2026-11-28)."""
    from lab.results import store

    script = [sys.executable, "-c", "import os; print('host jobs', os.environ['LAB_HOST_JOBS'])"]
    for campaigns, jobs in ((None, "1"), ("4", "4"), ("four", "1")):
        if campaigns is None:
            monkeypatch.delenv("LAB_HOST_CAMPAIGNS", raising=False)
        else:
            monkeypatch.setenv("LAB_HOST_CAMPAIGNS", campaigns)
        log = tmp_path / f"{campaigns}.log"
        assert cluster.run_job(script, str(log), pin=False)["exit"] == 0
        assert f"host jobs {jobs}\n" in log.read_text(), log.read_text()
    for value, recorded in (("4", 4), ("0", None), ("x", None), (None, None)):
        if value is None:
            monkeypatch.delenv("LAB_HOST_JOBS", raising=False)
        else:
            monkeypatch.setenv("LAB_HOST_JOBS", value)
        assert store.environment("cpu")["host_jobs"] == recorded, value

"""`lab census` on two tiny pipelines on the CPU: the pages and the table, a pipeline that fails recorded while the
other is measured, a resumed run that keeps the measured one and measures the failed one again, and a census that
lacks a fix the catalog now applies, which is owed again (to `lab census` and to a campaign)."""

from __future__ import annotations

import json

import pytest

from lab.results import store
from tests.conftest import lab_here


@pytest.mark.slow
def test_census_records_a_failure_measures_the_rest_and_resumes(tmp_path):
    out, traces = tmp_path / "census", tmp_path / "traces"
    # Wan video-to-video cannot run with the first-block cache on diffusers 0.37.1 ("No context is set"): a real
    # failure, beside Flux, which runs with it, and Flux2 Klein, which the lab refuses before the build.
    argv = ["census", "--pipeline", "wan_v2v,flux,flux2", "--setting", "first_block_cache", "--out", str(out),
            "--trace-dir", str(traces)]
    first = lab_here(*argv)
    assert first.returncode == 1, first.stderr
    assert "2 failed (wan_v2v, flux2)" in first.stderr
    tag = "eager__tiny-first_block_cache__cpu"

    failed = store.read(out / f"wan_v2v__{tag}.json")
    assert failed.kind == "census" and "No context is set" in failed.error
    assert "**Failed:**" in (out / f"wan_v2v__{tag}.md").read_text()
    refused = store.read(out / f"flux2__{tag}.json")  # refused before the build: it still names its setting
    assert "cannot run on `flux2`" in refused.error and not refused.arms and refused.what == ""
    assert refused.settings == ["first_block_cache (threshold=0.05)"]

    flux = store.read(out / f"flux__{tag}.json")
    assert flux.error is None and flux.settings and flux.settings[0].startswith("first_block_cache")
    # without fixes, each applicable fix alone, all together: the fix sets `lab ab --fix each` compares
    assert [a.fixes for a in flux.arms][0] == [] and len(flux.arms) >= 3
    assert flux.all_fixes.fixes == max((a.fixes for a in flux.arms), key=len)
    base = flux.baseline
    # the cache's decision reads a tensor on the host inside the loop (results/settings/tiny__cpu.md)
    assert base.in_loop > 0 and base.per_call == base.before_loop + base.in_loop + base.after_loop
    assert base.htod is None and base.cpu_gaps_ms is not None  # no copies to count on a CPU; gaps between calls
    # what filled those gaps, most self time first (the cache's decision, the scheduler's step, ...); no GPU to idle
    assert base.gap_fillers and base.gpu_idle_loop_ms is None
    assert [f["self_ms"] for f in base.gap_fillers] == sorted((f["self_ms"] for f in base.gap_fillers), reverse=True)
    assert sum(f["self_ms"] for f in base.gap_fillers) <= base.cpu_gaps_ms
    page = (out / f"flux__{tag}.md").read_text()
    assert "## What each fix removes" in page and "first_block_cache" in page
    assert "## What the host ran in the CPU gaps" in page and f"`{base.gap_fillers[0]['function']}`" in page

    table = (out / f"census__{tag}.md").read_text()
    assert "[flux](flux__" in table and "[wan_v2v](wan_v2v__" in table
    assert "- Failed: flux2, wan_v2v" in table or "- Failed: wan_v2v, flux2" in table
    counts, waste = table.split("## GPU-side waste")
    assert counts.count("\n| [") == 3
    # the waste table: the pipeline that completed, watched for GPU-side waste (flux feeds no strided activation)
    assert waste.count("\n| [") == 1 and "| [flux](flux__" in waste and "| 0 / 0 / 0 / 0 |" in waste
    assert "## Where the device time goes" in page and "## GPU-side waste (one watched call" in page
    # the heading is the measured pipeline's, whatever the order: its setting, and what a CPU counts
    assert table.startswith("# Census (tiny, eager, 4 steps, in first_block_cache") and "host scalar reads per call" in table

    # A resumed run keeps Flux (its file untouched) and measures Wan video-to-video again.
    stamp = json.loads((out / f"flux__{tag}.json").read_text())["created"]
    again = lab_here(*argv)
    assert again.returncode == 1
    assert "flux: kept" in again.stderr and "wan_v2v: failed before" in again.stderr
    assert "2 measured, 1 kept from before, 2 failed (wan_v2v, flux2)" in again.stderr
    assert json.loads((out / f"flux__{tag}.json").read_text())["created"] == stamp

    # As if measured before the catalog had hook_registry_cache: a campaign owes the cell, and the census measures
    # Flux again.
    from lab.campaigns import campaign

    stored = json.loads((out / f"flux__{tag}.json").read_text())
    stored["arms"] = [dict(a, fixes=[f for f in a["fixes"] if f != "hook_registry_cache"]) for a in stored["arms"]
                      if a["fixes"] != ["hook_registry_cache"]]
    (out / f"flux__{tag}.json").write_text(json.dumps(stored))
    plan_path = tmp_path / "census.toml"
    plan_path.write_text('[campaign]\ndescription = "census"\ndevice = "cpu"\n\n[[cell]]\nkind = "census"\n'
                         'pipeline = "flux"\nsize = "tiny"\nsetting = "first_block_cache"\n')
    [owed] = campaign.status(campaign.load(plan_path), tmp_path)
    assert owed.state == "new fixes" and owed.detail == "measured before the catalog had hook_registry_cache"
    third = lab_here("census", "--pipeline", "flux", "--setting", "first_block_cache", "--out", str(out),
                     "--trace-dir", str(traces))
    assert third.returncode == 0, third.stderr
    assert "flux: measured before the catalog had hook_registry_cache; measuring again" in third.stderr
    assert [s.state for s in campaign.status(campaign.load(plan_path), tmp_path)] == ["measured"]


def test_a_census_cell_in_a_campaign(tmp_path):
    from lab.campaigns import campaign

    path = tmp_path / "census.toml"
    path.write_text('[campaign]\ndescription = "census"\n\n[[cell]]\nkind = "census"\npipeline = ["flux", "wan"]\n'
                    'layers = 2\n')
    plan = campaign.load(path)
    cells = {c.pipeline: c for c in plan.cells}
    assert set(cells) == {"flux", "wan"} and all(c.fixes == () for c in cells.values())
    assert cells["wan"].stem("h200") == "wan__eager__full-2l__h200"
    argv = cells["wan"].argv(tmp_path / "results")
    assert argv[3:7] == ["census", "--pipeline", "wan", "--out"] and argv[7].endswith("results/census")
    assert [s.state for s in campaign.status(plan, tmp_path / "results")] == ["planned", "planned"]
    # a census of another diffusers: named for its version, beside the installed one's; `--diffusers` passed on
    path.write_text('[campaign]\ndescription = "census"\n\n[[cell]]\nkind = "census"\npipeline = "cosmos2"\n'
                    'layers = 2\ndiffusers = "0.42.1"\n')
    (cell,) = campaign.load(path).cells
    assert cell.stem("h100") == "cosmos2__eager__full-2l-diffusers0.42.1__h100"
    argv = cell.argv(tmp_path / "results")
    assert argv[argv.index("--diffusers") + 1] == "0.42.1"


def test_a_census_of_another_diffusers_lacks_no_fix_that_its_release_already_has():
    """The committed tiny census of Flux on diffusers 0.42.1 (this CPU): `hook_registry_cache` is in that release
    (0.41.0), so the census is not owed it, although the installed 0.37.1 lacks it."""
    import msgspec

    from lab.apply.fix import census_lacks
    from tests.conftest import ROOT

    result = store.read(ROOT / "results/census/flux__eager__tiny-diffusers0.42.1__cpu.json")
    assert result.diffusers == result.environment.diffusers == "0.42.1"
    assert "`hook_registry_cache` is already upstream in diffusers 0.42.1 (since 0.41.0); skipped." in result.skipped
    assert census_lacks(result) == []
    without_note = msgspec.structs.replace(result, skipped=[n for n in result.skipped if "hook_registry" not in n])
    assert census_lacks(without_note) == ["hook_registry_cache"]


@pytest.mark.slow
def test_a_census_of_another_diffusers_runs_in_a_process_that_imports_it(tmp_path):
    """A copy of the installed diffusers as a site-packages folder, its version marked: the census runs in a process
    that imports the copy (the result records the copy's version), and names its pages and table for it."""
    from tests.conftest import lab_forked, marked_diffusers_copy

    site, version = marked_diffusers_copy(tmp_path)
    out = tmp_path / "census"
    # the `lab census` a user starts hands the census on at once and computes nothing itself: forked from this process
    # (`lab_forked`); the process it starts, which imports the copy, is a fresh interpreter
    proc = lab_forked("census", "--pipeline", "flux", "--diffusers", str(site), "--out", str(out), "--trace-dir",
                      str(tmp_path / "traces"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"diffusers {version} (site-packages {site}): the census runs in a process that imports it" in err
    tag = f"eager__tiny-diffusers{version}__cpu"
    result = store.read(out / f"flux__{tag}.json")
    assert result.diffusers == version and result.environment.diffusers == version and result.error is None
    assert f"diffusers {version}." in (out / f"census__{tag}.md").read_text()
    assert not list(out.glob("*__eager__tiny__cpu.*"))  # nothing in the installed diffusers' name

    # a time limit's SIGTERM reaches the census process once, through the one that started it: what it measured
    # is kept, as in one process
    code, err = _stopped_after_its_first_arm("--pipeline", "wan", "--diffusers", str(site), "--out", str(out),
                                             "--trace-dir", str(tmp_path / "traces"), forked=True)
    assert code == 130, err[-2000:]
    stopped = store.read(out / f"wan__{tag}.json")
    assert stopped.interrupted and stopped.baseline is not None and stopped.diffusers == version


def test_what_runs_between_steps_belongs_to_the_step_that_follows():
    """A read in the loop before a step's first transformer call (SDXL's `scale_model_input` finding its index, Z-Image's
    `timestep[0].item()`) counts in that step; before the loop's mark it is before the loop."""
    import numpy as np

    from lab.traces.timeline import loop_step_of

    spans = [(0, 100, 200), (1, 250, 300), (2, 310, 400)]
    times = np.array([10, 60, 150, 220, 305, 350, 450])
    assert loop_step_of(times, spans, begin=50).tolist() == [-1, 0, 0, 1, 2, 2, -1]
    assert loop_step_of(times, spans, begin=100).tolist() == [-1, -1, 0, 1, 2, 2, -1]
    assert loop_step_of(times, [], begin=None).tolist() == [-1] * 7


def test_a_gpu_census_table_counts_syncs_even_when_a_refused_pipeline_comes_first():
    from pathlib import Path

    from lab.pages import census_report

    folder = Path(__file__).resolve().parent.parent / "results" / "census"
    tag = "eager__full-2l-first_block_cache-threshold0.2__h100"
    refused, measured = (store.read(folder / f"{name}__{tag}.json") for name in ("flux2", "wan"))
    assert refused.error and not refused.what and measured.what.startswith("sync calls")
    table = census_report.table([refused, measured])
    assert table.startswith("# Census (full, 2 blocks, eager, 4 steps, in first_block_cache (threshold=0.2), NVIDIA H100")
    assert "| pipeline | syncs per call |" in table and "Loop free of syncs as shipped" in table
    assert "host scalar reads per call" not in table
    assert "Counting syncs;" in census_report.markdown(refused)  # its page, too, says what a GPU census counts


def test_the_settings_plot_draws_the_pipelines_measured_in_more_than_one_setting(tmp_path):
    import shutil
    from pathlib import Path

    from lab.pages import census_report

    folder = Path(__file__).resolve().parent.parent / "results" / "census"
    for name in ("wan__eager__full-2l__h100", "wan__eager__full-2l-lora__h100", "flux2__eager__full-2l__h100",
                 "flux2__eager__full-2l-first_block_cache-threshold0.2__h100", "flux__eager__full-2l-lora__h100",
                 "flux__compile__full-2l__h100"):
        shutil.copy(folder / f"{name}.json", tmp_path / f"{name}.json")
    found = [(p, store.read(p)) for p in sorted(tmp_path.glob("*.json"))]
    groups = census_report.settings_groups(found)
    # Flux2 Klein's second setting was refused (nothing to draw), Flux is in one setting per mode: Wan alone
    [(plot, rs)] = groups.items()
    assert plot == tmp_path / "census__eager__full-2l__h100__settings.png"
    assert sorted(census_report._setting_label(r) for r in rs) == [
        "lora (rank=16, scale=1.0, fused=False, seed=0)", "no setting"]
    assert census_report.settings_plot(rs, plot).stat().st_size > 0


def test_the_settings_table_has_a_row_per_setting_and_says_where_a_pipeline_could_not_take_one(tmp_path):
    """`lab table`'s matrix of the census in settings: the pipelines measured in two settings or more, one row per
    setting, each cell the syncs in the loop per step without -> with every fix (per call); a refusal and a failure
    while measuring each say so, where the plot has nothing to draw."""
    import shutil
    from pathlib import Path

    from lab.pages import census_report

    folder = Path(__file__).resolve().parent.parent / "results" / "census"
    for name in ("wan__eager__full-2l__h100", "wan__eager__full-2l-first_block_cache-threshold0.2__h100",
                 "wan__eager__full-2l-attention_backend-flex__h100", "flux2__eager__full-2l__h100",
                 "flux2__eager__full-2l-lora__h100", "flux2__eager__full-2l-first_block_cache-threshold0.2__h100",
                 "flux__eager__full-2l-lora__h100"):
        shutil.copy(folder / f"{name}.json", tmp_path / f"{name}.json")
    found = [(p, store.read(p)) for p in sorted(tmp_path.glob("*.json"))]
    assert [r.scenario for r in census_report.settings_groups(found)[tmp_path / "census__eager__full-2l__h100__settings.png"]
            if r.error] == []  # the plot draws no failure
    [(_, rs)] = census_report.settings_groups(found, everything=True).items()
    lines = census_report.settings_table(rs)
    assert lines[0] == "| setting | `flux2` | `wan` |"  # FLUX.1 is in one setting only
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert list(rows)[0] == "no setting"
    assert rows["no setting"] == ["0.00 -> 0.00 (8 -> 5)", "5.25 -> 0.00 (23 -> 2) |"]
    assert rows["first_block_cache (threshold=0.2)"] == ["refused", "6.75 -> 1.50 (29 -> 8) |"]
    assert rows["attention_backend (backend=flex)"] == ["—", "failed (OutOfMemoryError) |"]


def test_a_table_in_a_setting_says_what_the_setting_adds_to_the_census_without_it(tmp_path):
    import shutil
    from pathlib import Path

    from lab.pages import census_report

    folder = Path(__file__).resolve().parent.parent / "results" / "census"
    names = ("wan__eager__full-2l__h100", "wan__eager__full-2l-first_block_cache-threshold0.2__h100",
             "flux2__eager__full-2l-first_block_cache-threshold0.2__h100", "flux__eager__full-2l-first_block_cache-threshold0.2__h100")
    for name in names:
        shutil.copy(folder / f"{name}.json", tmp_path / f"{name}.json")
    pages = census_report.pages([(p, store.read(p)) for p in sorted(tmp_path.glob("*.json"))])
    table = pages[tmp_path / "census__eager__full-2l-first_block_cache-threshold0.2__h100.md"]
    # Wan's census without a setting is here: the first-block cache's decision, one per transformer call after the
    # first step; Flux's is not (nothing to compare with), nor Flux2 Klein's (refused)
    assert ("- [wan](wan__eager__full-2l__h100.md): 5.25 -> 6.75 per step without fixes (+1.50), 0.00 -> 1.50 with "
            "every applicable fix (+1.50); 23 -> 29 per call without fixes.") in table
    assert "- [flux](" not in table.split("What the setting adds")[1] and "[flux2](flux2__eager__full-2l__h100" not in table
    assert "What the setting adds" not in pages[tmp_path / "census__eager__full-2l__h100.md"]


@pytest.mark.slow
def test_an_interrupted_census_keeps_its_arms_and_is_owed_not_failed(tmp_path):
    """A time limit's SIGTERM (or a Ctrl-C) during a pipeline's arms: the arms that completed are kept, the page says
    interrupted, `lab census` again measures the pipeline, and a campaign counts its cell as planned, not failed."""
    from lab.campaigns import campaign

    out = tmp_path / "results" / "census"
    code, err = _stopped_after_its_first_arm("--pipeline", "wan", "--out", str(out), "--trace-dir",
                                             str(tmp_path / "traces"))
    assert code == 130, err[-2000:]
    stopped = store.read(out / "wan__eager__tiny__cpu.json")
    assert stopped.interrupted and len(stopped.arms) >= 1 and stopped.baseline is not None
    assert "**Interrupted** after" in (out / "wan__eager__tiny__cpu.md").read_text()
    assert "Interrupted, to be measured again: wan." in (out / "census__eager__tiny__cpu.md").read_text()
    path = tmp_path / "census.toml"
    path.write_text('[campaign]\ndescription = "census"\ndevice = "cpu"\n\n[[cell]]\nkind = "census"\n'
                    'pipeline = "wan"\nsize = "tiny"\n')
    (state,) = campaign.status(campaign.load(path), tmp_path / "results")
    assert (state.state, state.verdict) == ("planned", "interrupted")


def _stopped_after_its_first_arm(*args: str, forked: bool = False) -> tuple[int, str]:
    """`lab census ARGS` as a user runs it, sent a time limit's SIGTERM once its arm without fixes is done: its exit
    code and what it printed. `forked`: the process is forked from this one (`lab_forked`), for a census that hands
    itself on to a process of another diffusers (the one measuring, a fresh interpreter, is that one's child)."""
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT, lab_forked

    proc = (lab_forked("census", *args) if forked else
            subprocess.Popen([sys.executable, "-m", "lab.cli", "census", *args], cwd=ROOT, stderr=subprocess.PIPE,
                             text=True))
    for line in proc.stderr:
        if line.strip().startswith("with "):  # the arm without fixes is done
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.slow
def test_a_census_of_the_ends_measures_without_and_with_every_fix_and_owes_nothing(tmp_path):
    """`--arms ends` (the compiled census, where every arm compiles again): without fixes and with all of them (and
    alone a fix that conflicts with one of those, Wan's `unipc_stack`); the census is not owed again for the fixes it did not run alone, and its page
    says where the per-fix attribution is. A campaign cell passes the option on."""
    from lab.apply.fix import census_lacks, each_sets
    from lab.campaigns import campaign

    out = tmp_path / "census"
    proc = lab_here("census", "--pipeline", "wan", "--arms", "ends", "--out", str(out), "--trace-dir",
                    str(tmp_path / "traces"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = store.read(out / "wan__eager__tiny__cpu.json")
    every = sorted(f.name for f in each_sets("wan")[-1][0])  # unipc_stack conflicts with them: it runs alone
    assert [a.fixes for a in result.arms] == [[], every, ["unipc_stack"]] and len(every) > 1
    assert census_lacks(result) == []
    assert result.arms[0].scalar_reads > result.arms[1].scalar_reads  # the fixes remove Wan's reads on a CPU too
    assert "`lab census --arms ends`" in (out / "wan__eager__tiny__cpu.md").read_text()
    path = tmp_path / "c.toml"
    path.write_text('[campaign]\n[[cell]]\nkind = "census"\npipeline = "wan"\nmode = "compile"\narms = "ends"\n')
    (cell,) = campaign.load(path).cells
    argv = cell.argv(tmp_path / "results")
    assert argv[argv.index("--arms") + 1] == "ends"

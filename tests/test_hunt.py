"""`lab scan` finds the known candidates; `lab hunt` merges runtime sites with them (CPU: host scalar reads)."""

import json

import pytest

from lab.measure import scan
from tests.conftest import ROOT, lab_here

UNIPC = "diffusers/schedulers/scheduling_unipc_multistep.py"


@pytest.fixture(scope="module")
def unipc_findings():
    path = scan.diffusers_root() / UNIPC
    return scan.scan([path])


def test_scan_finds_the_known_unipc_candidates(unipc_findings):
    by_pattern = {}
    for f in unipc_findings:
        by_pattern.setdefault(f.pattern, []).append(f)
    assert {f.function for f in by_pattern["linalg_solve"]} == {
        "UniPCMultistepScheduler.multistep_uni_p_bh_update", "UniPCMultistepScheduler.multistep_uni_c_bh_update"}
    assert any(f.function.endswith("index_for_timestep") for f in by_pattern["nonzero"])
    assert len(by_pattern["tensor_on_device"]) == 6  # rks, b and the 0.5 constant in both updates (0.37.1)
    assert all(f.path == UNIPC and f.line > 0 for f in unipc_findings)


def test_scan_on_source_text(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def f(self, t, ids):\n        h = torch.max(ids) + 1\n        if t.all():\n"
                   "            return float(t[0])\n        s = torch.from_numpy(ids).to(device=d)\n        t = t.to(d)\n"
                   "        return t.sigmas[0].to(device)\n")
    found = {(f.pattern, f.line) for f in scan.scan([src])}
    # `t.to(d)` of a tensor of unknown origin is not a candidate: only what was visibly built on the host
    assert found == {("shape_from_max", 3), ("truth_of_reduction", 4), ("scalar_cast", 5), ("created_then_moved", 6),
                     ("indexed_to_device", 8)}



@pytest.mark.slow
def test_hunt_before_and_after_the_host_coefficients_fix(tmp_path):
    done = lab_here("hunt", "--pipeline", "wan", "--fix", "unipc_host_coeffs,begin_index", "--baseline", "--out",
                    str(tmp_path), "--trace-dir", str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr[-2000:]
    b = json.loads((tmp_path / "wan__eager__tiny__cpu.json").read_text())
    a = json.loads((tmp_path / "wan__unipc_host_coeffs+begin_index__eager__tiny__cpu.json").read_text())
    assert "no device syncs" in b["what"] and b["fixes"] == [] and a["fixes"] == ["unipc_host_coeffs", "begin_index"]
    sites = {s["function"]: s for s in b["sites"]}
    assert sites["multistep_uni_p_bh_update"]["static"] and sites["index_for_timestep"]["phases"] == {"in loop": 1}
    after_sites = {s["function"] for s in a["sites"]}
    # the predictor's reads and the first-step index lookup are gone; what stays is linalg.solve on CPU tensors
    assert "multistep_uni_p_bh_update" not in after_sites and "index_for_timestep" not in after_sites
    assert a["per_call"] < b["per_call"]
    compared = (tmp_path / "wan__unipc_host_coeffs+begin_index__eager__tiny__cpu__before-after.md").read_text()
    assert f"per call: **{b['per_call']} -> {a['per_call']}**" in compared
    assert "**not met**" in compared and "`multistep_uni_c_bh_update`" in compared
    row = next(line for line in compared.splitlines() if "`multistep_uni_p_bh_update`" in line)
    assert f"| {sites['multistep_uni_p_bh_update']['profiler_count']} | 0 |" in row


def test_hunt_baseline_needs_fixes(tmp_path):
    done = lab_here("hunt", "--pipeline", "wan", "--baseline", "--out", str(tmp_path))
    assert done.returncode == 2 and "ERROR: --baseline" in done.stderr and "Traceback" not in done.stderr


def test_sync_warnings_are_attributed_to_the_line_that_synced(tmp_path, monkeypatch):
    """What CUDA sync debug mode does, without CUDA: a warning raised inside an op called from user code. The site
    must be the user's line (not the warnings machinery), named as the profiler names it (relative to sys.path)."""
    import warnings

    from lab.measure import hunt

    pkg = tmp_path / "site" / "fakediffusers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sched.py").write_text(
        "import warnings\n\n\ndef op():\n    warnings.warn('called a synchronizing CUDA operation')\n\n\n"
        "def step():\n    x = 1\n    op()\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import fakediffusers.sched as sched

    records = []
    with hunt.sync_warning_capture(records):
        sched.step()
        warnings.warn("an unrelated warning")  # shown, not recorded
    sites = hunt.debug_records(records)
    # the innermost frame outside torch, the lab and the standard library is op() at line 5 (the "op" that synced)
    assert sites == [{"path": "fakediffusers/sched.py", "line": 5, "function": "op"}]


def test_hunt_rows_in_the_tables(tmp_path):
    """`lab table` pairs each hunt with fixes with the hunt without fixes of the same setting and checks the loop."""
    import shutil

    from lab.pages import table

    src = ROOT / "results" / "hunt"
    (tmp_path / "hunt").mkdir()
    before = src / "wan__eager__full-4l__h200.json"
    after = src / "wan__begin_index+hook_registry_cache+no_progress_bar+unipc_device_const+unipc_host_coeffs__eager__full-4l__h200.json"
    shutil.copy(before, tmp_path / "hunt" / before.name)
    data = json.loads(after.read_text())
    data["sites"].append({"path": "diffusers/x.py", "function": "f", "def_line": 1, "lines": [], "profiler_count": 3,
                          "debug_count": 0, "blocked_us": 0.0, "per_step": {"0": 3}, "phases": {"in loop": 3},
                          "static": []})
    data["per_call"] += 3
    data["in_loop_per_step"] += 3 / data["steps"]
    (tmp_path / "hunt" / after.name).write_text(json.dumps(data))
    rows = [line for line in table.hunt_table(tmp_path) if line.startswith("| wan")]
    b = json.loads(before.read_text())
    assert len(rows) == 1 and f"| {b['per_call']} -> {data['per_call']} |" in rows[0]
    assert "no (3 per call)" in rows[0] and "[before](hunt/wan__eager__full-4l__h200.md)" in rows[0]


@pytest.mark.slow
def test_per_step_counts_divide_by_the_steps_that_ran(tmp_path):
    """Video-to-video at strength 0.8 runs 3 of 4 steps: the per-step count must divide by 3."""
    done = lab_here("hunt", "--pipeline", "wan_v2v", "--out", str(tmp_path), "--trace-dir", str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads((tmp_path / "wan_v2v__eager__tiny__cpu.json").read_text())
    in_loop = sum(s["phases"].get("in loop", 0) for s in r["sites"])
    assert r["steps"] == 4 and r["steps_run"] == 3 and in_loop > 0
    assert r["in_loop_per_step"] == pytest.approx(in_loop / 3)
    assert "(tiny, eager, 4 steps, 3 run)" in (tmp_path / "wan_v2v__eager__tiny__cpu.md").read_text()

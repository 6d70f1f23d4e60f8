"""What the trace says a fix can win, next to what the clock measured (lab.pages.report.time_accounting)."""

import msgspec
import pytest

from lab import results
from lab.pages import report
from lab.results.schema import ABResult, replace
from lab.verdicts.verdict import Verdict
from tests.conftest import ROOT


def _ab(**fields) -> ABResult:
    """A typed A/B result holding `fields` (the rest filled in)."""
    return msgspec.convert({"name": "x", "created": "", "command": "lab ab", "scenario": "wan", "size": "full",
                            "steps": 4, "mode": "eager", "fixes": ["f"], "config": {}, "verdict": "faster",
                            "environment": {"device": "cpu"}, **fields}, ABResult)


def _result(on_gpu=True, idle=(30_000.0, 10_000.0), blocked=(1_000_000.0, 500_000.0)):
    return _ab(environment={"device": "cuda" if on_gpu else "cpu", "gpu": "NVIDIA H200" if on_gpu else None},
               profile={"metrics": {"gpu_idle_us": {"control": idle[0], "test": idle[1]},
                                    "sync_blocked_us": {"control": blocked[0], "test": blocked[1]}}},
               stats={"n": 8, "control_median": 2000.0, "test_median": 1990.0, "ratio": 0.995, "ci": [0.99, 1.0],
                      "ci_equivalence": [0.99, 1.0], "level": "95%", "level_equivalence": "90%",
                      "design": {"kind": "fixed"}, "alpha": 0.05, "margin": 0.01})


def test_no_accounting_without_a_gpu_profile():
    assert report.time_accounting(_result(on_gpu=False)) is None  # a CPU "GPU idle" means nothing
    assert report.time_accounting(_result(idle=(None, None))) is None
    assert report.time_accounting(replace(_result(), stats=None)) is None


def test_a_profiled_idle_change_beyond_the_whole_call_is_no_share_of_it():
    # an A/A of two worker processes (H200): 91.7 ms less idle in the profiled calls of a 62.9 ms timed call
    text = report.time_accounting(_result(idle=(100_000.0, 8_000.0)))
    assert "more than the whole 2,000.0 ms" not in text
    text = report.time_accounting(_result(idle=(2_100_000.0, 8_000.0)))
    assert "GPU idle (2,100.0 ms) exceeds the whole timed control call (2,000.0 ms)" in text
    assert "profiler's own overhead dominates" in text
    assert "%" not in text.split("Host time")[0] and "the most that removing host stalls can win" not in text


def test_accounting_separates_gpu_idle_from_host_blocked():
    text = report.time_accounting(_result())
    assert "removed 20.0 ms of GPU idle per call" in text and "(1.00% of the 2,000.0 ms control call)" in text
    assert "Host time blocked in syncs changed by -500.0 ms" in text and "does not shorten the call" in text
    assert "Measured: 10.0 ms saved per call (95% CI 0.0 to 20.0 ms)" in text
    grew = report.time_accounting(_result(idle=(10_000.0, 14_000.0)))
    assert "GPU idle per call grew by 4.0 ms in the profiled calls (0.20% of the 2,000.0 ms control call)" in grew
    assert "the most" not in grew


def test_a_saving_beyond_the_idle_removed_is_gpu_work_the_fix_took_out():
    # group_offload_keep_host (H100): 1.1 s less idle per profiled call, a 9 s saving: the copies back to the host went
    assert "more than that bound" not in report.time_accounting(_result())  # 0.0 ms at least: within the bound
    r = replace(_result(), stats=replace(_result().stats, ratio=0.3, ci=(0.25, 0.4)))
    r.profile["metrics"].update(memcpy_HtoD={"control": 1556, "test": 1556}, memcpy_DtoH={"control": 1552, "test": 0})
    text = report.time_accounting(r)
    assert text.endswith("The clock saved more than that bound (at least 1,200.0 ms per call): the fix also took GPU "
                         "work out of the call (copies per call: 1,552 -> 0 device-to-host).")


def test_accounting_says_how_far_to_trust_the_idle_difference():
    r = _result()
    assert "It rests on one profiled call per arm, which is noisy." in report.time_accounting(r)
    r.profile["metrics"]["gpu_idle_us"].update(control_range=[28_000.0, 31_000.0], test_range=[9_000.0, 12_000.0])
    text = report.time_accounting(r)
    assert "noisy" not in text and "overlap" not in text
    r.profile["metrics"]["gpu_idle_us"]["test_range"] = [9_000.0, 29_000.0]
    assert "ranges over the profiled calls overlap" in report.time_accounting(r)


def test_accounting_of_a_committed_gpu_result():
    # unipc_host_coeffs on Wan under regional compile, H200 (faithful build): the one Wan fix measured faster
    r = results.read(ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json")
    text = report.time_accounting(r)
    assert "removed 14.7 ms of GPU idle" in text and "Host time blocked in syncs changed by +12.1 ms" in text
    # 2,379.7 ms x (1 - 0.99429), Hodges-Lehmann, and the interval the sequential rule decided on
    assert "Measured: 13.6 ms saved per call (95% sequential (99.07% per look) CI 6.6 to 24.4 ms)" in text
    assert "Where the time went" in report.markdown(r)


def test_the_page_says_which_run_measured_which_blocks_and_a_run_that_measured_none():
    def run(blocks, stopped):
        return {"created": "2026-11-28", "command": "lab ab --resume", "blocks": blocks, "stopped": stopped}

    lines = report.segment_lines(_ab(segments=[run(3, "time limit"), run(1, "time limit"), run(0, "time limit")]))
    assert lines[0].startswith("The blocks were measured in 3 runs")
    assert [line.split(":")[0] for line in lines[2:5]] == ["- blocks 1-3", "- block 4", "- no block"]


def test_the_page_of_a_release_pair_names_the_sites_whose_reads_and_syncs_changed():
    # measured on the H200: diffusers 0.38.0 moved UniPC's per-step scalar reads off the host
    r = results.read(ROOT / "results/ab/wan/diffusers-0.37.1-to-0.38.0__eager__full-4l__h200.json")
    lines = report.site_lines(r)
    assert lines[0].startswith("Where the syncs and host scalar reads changed")
    rows = {line.split(" | ")[1].strip("`"): line for line in lines if line.startswith("| host") or line.startswith("| sync")}
    assert rows["diffusers/schedulers/scheduling_unipc_multistep.py:833 multistep_uni_p_bh_update"].endswith("| 8 | 0 |")
    assert "| host scalar read | `diffusers/schedulers/scheduling_unipc_multistep.py:833" in report.markdown(r)


def test_no_site_table_when_nothing_changed():
    r = _ab(profile={"sync_sites": {"a.py:1 f": {"control": 2, "test": 2}},
                     "host_read_sites": {"control": {"b.py:3 g": 1}, "test": {"b.py:3 g": 1}}})
    assert report.site_lines(r) == []


def test_a_replaced_result_without_timing_leaves_no_plot_of_the_old_one(tmp_path):
    timed = results.read(ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json")
    paths = {k: tmp_path / f"cell.{k}" for k in ("json", "md", "png")}
    report.write_ab(timed, paths, replace=True)
    assert paths["png"].exists() and "cell.png" in paths["md"].read_text()
    untimed = replace(timed, verdict=Verdict.OUTPUTS_DIFFER, samples=None, stats=None, order=None)
    report.write_ab(untimed, paths, replace=True)
    assert not paths["png"].exists() and "cell.png" not in paths["md"].read_text()


def test_a_plot_is_stored_as_a_palette_png_with_its_colours_kept(tmp_path):
    """`figure.save` renders, stores 256 colours at most, writes whole and closes the figure; flat colours survive."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from lab.pages import figure

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.axis("off")
    fig.patch.set_facecolor("#ffffff")
    ax.add_patch(plt.Rectangle((0, 0), 0.5, 1, color="#2ca02c", transform=ax.transAxes))  # matplotlib's green
    ax.add_patch(plt.Rectangle((0.5, 0), 0.5, 1, color="#d62728", transform=ax.transAxes))  # and red
    path = figure.save(fig, tmp_path / "plot.png")
    assert not plt.get_fignums()  # closed
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]  # no temporary file left beside it
    with Image.open(path) as image:
        assert image.mode == "P" and image.size == (2 * figure.DPI, 1 * figure.DPI)
        colours = {c for _, c in image.convert("RGB").getcolors()}
    assert {(0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28), (255, 255, 255)} <= colours

    # an image of few colours round-trips exactly
    literal = Image.new("RGB", (3, 1))
    literal.putdata([(0, 0, 0), (255, 0, 0), (0, 0, 255)])
    raw = io.BytesIO()
    literal.save(raw, format="PNG")
    with Image.open(io.BytesIO(figure.palette_png(raw.getvalue()))) as back:
        assert back.mode == "P" and [back.convert("RGB").getpixel((x, 0)) for x in range(3)] == [(0, 0, 0), (255, 0, 0), (0, 0, 255)]


def test_a_failed_render_leaves_the_old_plot_and_closes_the_figure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lab.pages import figure

    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    fig, ax = plt.subplots()
    ax.set_title("$\\notacommand$")  # mathtext that cannot render: savefig raises
    with pytest.raises(ValueError):
        figure.save(fig, path)
    assert path.read_bytes() == b"old" and not plt.get_fignums()


def test_a_moved_control_median_names_the_hosts_its_runs_were_on():
    """LTX2's compiled `group_offload_keep_host` (H200): its first 2 blocks on a two-GPU host of 32 CPUs at 22.6 s
    control calls, the next 6 on a four-GPU host of 64 CPUs, beside three other campaigns, at 29.8 s. Each run's
    segment records its host's CPUs; the warning and the page say which run was on which host."""
    from lab.measure import cell

    went_on = results.read(ROOT / "results/ab/ltx2/group_offload_keep_host__compile__full-8l-group_offload__h200.json")
    first, second, _ = went_on.segments
    before = replace(went_on, segments=[replace(first, cpus=32), replace(second, cpus=64)])
    runs, warnings = cell.segments(before, went_on)
    assert [s.cpus for s in runs] == [32, 64, went_on.environment.cpus] == [32, 64, 64]
    assert [s.blocks for s in runs] == [2, 3, 3]
    (warning,) = warnings
    assert "(22,625.1, 29,846.9, 29,757.7 ms; on hosts of 32 CPUs (22,625.1 ms), 64 CPUs (29,846.9 ms), 64 CPUs " \
           "(29,757.7 ms))" in warning, warning
    lines = report.segment_lines(replace(went_on, segments=runs))
    assert "control median 22,625.1 ms, driver 580.159.04, a host of 32 CPUs, lab e1df087+dirty" in lines[2], lines
    # one size of host throughout (or none recorded, as before): the warning says nothing of hosts
    _, (same,) = cell.segments(replace(went_on, segments=[first, second]), went_on)
    assert "hosts" not in same and "29,757.7 ms)" in same
    # hosts of one size measuring different numbers of jobs at once (each run's `host_jobs`): the warning says so
    alone = replace(went_on, environment=replace(went_on.environment, host_jobs=4))
    runs, (warning,) = cell.segments(replace(went_on, segments=[replace(first, cpus=64, host_jobs=2),
                                                              replace(second, cpus=64, host_jobs=4)]), alone)
    assert [s.host_jobs for s in runs] == [2, 4, 4]
    assert "on hosts of 64 CPUs running 2 jobs at once (22,625.1 ms), 64 CPUs running 4 jobs at once" in warning, \
        warning
    lines = report.segment_lines(replace(went_on, segments=runs))
    assert ", a host of 64 CPUs measuring 2 campaign jobs at once, lab " in lines[2], lines
    # a run before the lab recorded it beside runs that did: it is not read as one alone
    runs, (warning,) = cell.segments(replace(went_on, segments=[replace(first, cpus=64),
                                                              replace(second, cpus=64, host_jobs=4)]), alone)
    assert "on hosts of 64 CPUs (22,625.1 ms; jobs at once not recorded), 64 CPUs running 4 jobs at once " \
           "(29,846.9 ms)" in warning, warning


def test_a_page_says_where_the_device_time_went_and_how_the_outputs_compared():
    """A committed H200 A/B of upstream #12955 on Z-Image: not bit-identical, numerically equivalent against the
    float32 reference; the attention's device time per step fell; the MFU is read at the timed steps."""
    result = results.read(ROOT / "results" / "ab" / "zimage" / "patch-zimage_mask_none__eager__full-4l__h200.json")
    assert result.verify.equality == "numerically equivalent" and not result.verify.identical
    page = report.markdown(result)
    assert "**numerically equivalent**" in page and "against a float32 on cuda reference" in page
    assert "Device work per step by kind (kernels; median over 3 profiled calls)" in page
    row = next(line for line in page.splitlines() if line.startswith("| attention |"))
    before, after = (float(cell.split()[0]) for cell in row.split("|")[2:4])
    assert after < before
    timed = report.mean_step_ms(result)
    assert timed["test"] < timed["control"] and "of the timed step" in page

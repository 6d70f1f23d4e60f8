"""Which setting should a user run (`lab settings --pipeline`): the Pareto front and the fastest point within a budget
on literal points, and the map of a tiny pipeline on the CPU, written and read back."""

import json

import pytest

from lab.pages.settings_map import fastest_within, front
from lab.results.schema import SettingPoint


def p(setting, arm, call_ms, gb, error=""):
    return SettingPoint(setting=setting, arm=arm, call_ms=call_ms, peak_reserved_gb=gb, error=error)


POINTS = [p("none", "upstream", 1000.0, 40.0), p("none", "fixed", 950.0, 40.0),
          p("model_cpu_offload", "upstream", 20000.0, 26.0), p("model_cpu_offload", "fixed", 1400.0, 26.0),
          p("group_offload-stream", "upstream", 1600.0, 6.0), p("group_offload-stream", "fixed", 1500.0, 6.5),
          p("sequential_cpu_offload", "upstream", 30000.0, 2.0), p("group_offload", "upstream", 1.0, 1.0, "failed")]


def test_the_front_holds_what_nothing_beats_in_both_memory_and_time():
    found = [(x.setting, x.arm) for x in front(POINTS)]
    assert found == [("sequential_cpu_offload", "upstream"), ("group_offload-stream", "upstream"),
                     ("group_offload-stream", "fixed"), ("model_cpu_offload", "fixed"), ("none", "fixed")]
    assert ("none", "upstream") not in found  # as large as the fixed arm and slower
    assert ("group_offload", "upstream") not in found  # a failed point is never on it


@pytest.mark.parametrize("budget, expected", [(48, ("none", "fixed")), (30, ("model_cpu_offload", "fixed")),
                                              (6.2, ("group_offload-stream", "upstream")),
                                              (4, ("sequential_cpu_offload", "upstream")), (1.5, None)])
def test_the_fastest_within_a_budget(budget, expected):
    found = fastest_within(POINTS, budget)
    assert (found.setting, found.arm) == expected if expected else found is None


@pytest.mark.slow
def test_a_tiny_map_on_the_cpu_is_written_and_reads_back(tmp_path, capfd):
    from lab import cli, results

    code = cli.main(["settings", "--pipeline", "wan", "--try", "none", "--try", "layerwise_casting", "--try",
                     "group_offload", "--calls", "1", "--out", str(tmp_path)])
    assert code == 0
    err = capfd.readouterr().err
    assert "not measured: `group_offload` on cpu" in err  # refused before the build, with the reason
    path = tmp_path / "wan__tiny-2steps__cpu.json"
    result = results.read(path)
    assert result.kind == "settings-map" and [(x.setting, x.arm) for x in result.points] == [
        ("none", "upstream"), ("none", "fixed"), ("layerwise_casting", "upstream"), ("layerwise_casting", "fixed")]
    assert all(x.call_ms > 0 and len(x.calls_ms) == 1 for x in result.points)
    assert result.compute_ms == result.points[0].call_ms
    # the process's first call is taken before the first point and timed for none of them
    assert len(result.first_calls_ms) == 1 and result.first_calls_ms[0] > 0
    assert "first call, with nothing on and timed for no point" in (tmp_path / "wan__tiny-2steps__cpu.md").read_text()
    # the host memory each point held at its peak (the built pipeline's weights at least), and the host's total
    assert all(0 < x.host_peak_gb < result.environment.host_memory_gb for x in result.points)
    fixed = result.points[1]
    assert "hook_registry_cache" in fixed.fixes and "first_block_cache_lagged" not in fixed.fixes
    assert json.loads(path.read_text())["kind"] == "settings-map"
    assert "| `layerwise_casting` | fixed |" in (tmp_path / "wan__tiny-2steps__cpu.md").read_text()

    # a map going on from this one whose fixed point ran other fixes than the catalog gives it now (a fix added
    # since): that arm is measured again, with a note naming what it ran; a setting with one arm kept (a map cut
    # short between its arms) gets the other; every other point stands
    stored = json.loads(path.read_text())
    casting = next(x for x in stored["points"] if (x["setting"], x["arm"]) == ("layerwise_casting", "fixed"))
    casting["fixes"] = ["hook_registry_cache"]
    stored["points"] = [x for x in stored["points"] if (x["setting"], x["arm"]) != ("none", "fixed")]
    path.write_text(json.dumps(stored))
    code = cli.main(["settings", "--pipeline", "wan", "--try", "none", "--try", "layerwise_casting", "--calls", "1",
                     "--out", str(tmp_path), "--resume"])
    assert code == 0
    assert "layerwise_casting: the catalog's fixes for it are now" in capfd.readouterr().err
    again = results.read(path)
    assert again.first_calls_ms[0] == result.first_calls_ms[0] and len(again.first_calls_ms) == 2  # one per process
    kept = {(x.setting, x.arm): x for x in result.points}
    assert [(x.setting, x.arm) for x in again.points] == [
        ("none", "upstream"), ("none", "fixed"), ("layerwise_casting", "upstream"), ("layerwise_casting", "fixed")]
    assert all(x.calls_ms == kept[x.setting, x.arm].calls_ms for x in again.points if x.arm == "upstream")
    assert again.points[1].calls_ms != kept["none", "fixed"].calls_ms  # measured again
    remeasured = again.points[3]
    assert sorted(remeasured.fixes) == sorted(fixed.fixes) and "(an earlier map's fixed arm ran hook_registry_cache)" \
        in remeasured.note

    # measuring a kept arm again that then fails keeps the kept one, with why (nothing measured is lost)
    from lab.measure import settings_map

    stored = json.loads(path.read_text())
    next(x for x in stored["points"] if (x["setting"], x["arm"]) == ("layerwise_casting", "fixed"))["fixes"] = ["x"]
    path.write_text(json.dumps(stored))
    point = settings_map.point

    def failing(built, text, arm, *args, **kwargs):
        if arm == "fixed":
            raise RuntimeError("it broke")
        return point(built, text, arm, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(settings_map, "point", failing)
        assert cli.main(["settings", "--pipeline", "wan", "--try", "layerwise_casting", "--calls", "1", "--out",
                         str(tmp_path), "--resume"]) == 0
    last = {(x.setting, x.arm): x for x in results.read(path).points}
    assert last["layerwise_casting", "fixed"].fixes == ["x"] and not last["layerwise_casting", "fixed"].error
    assert last["layerwise_casting", "fixed"].note.endswith("measuring it again failed: RuntimeError: it broke")
    assert last["layerwise_casting", "fixed"].calls_ms == remeasured.calls_ms

    # and one a Ctrl-C cuts short before its arm is measured again stays as it was
    def interrupted(built, text, arm, *args, **kwargs):
        if arm == "fixed":
            raise KeyboardInterrupt
        return point(built, text, arm, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(settings_map, "point", interrupted)
        assert cli.main(["settings", "--pipeline", "wan", "--try", "layerwise_casting", "--calls", "1", "--out",
                         str(tmp_path), "--resume"]) == 130
    cut = results.read(path)
    assert cut.interrupted and {(x.setting, x.arm): x for x in cut.points}["layerwise_casting", "fixed"].calls_ms \
        == remeasured.calls_ms
    # its page says the answers hold among the settings measured so far
    page = (tmp_path / "wan__tiny-2steps__cpu.md").read_text()
    assert "**A partial map:** it was cut short before its last point" in page
    assert "among the 2 setting(s) measured so far (`layerwise_casting`, `none`)" in page


@pytest.mark.parametrize("failing", [None, "upstream"])
def test_a_setting_is_turned_on_once_for_its_arms_and_afresh_after_one_that_failed(tmp_path, monkeypatch, failing):
    """As an A/B keeps a setting on while its fixes come and go, the map turns each setting on once for both arms
    (turning an offloading mode on and off copies the model each way), and off after the last; an arm that fails
    leaves the setting in a state nobody knows, so it is turned off then and on afresh for the next."""
    from lab import cli, results
    from lab.measure import settings_map
    from lab.run import settings

    turned: list[str] = []
    apply, point = settings.apply, settings_map.point

    def counted(chosen, built):
        turned.append("on " + "+".join(s.name for s in chosen))
        undo = apply(chosen, built)
        return lambda: (turned.append("off"), undo())

    def measured(built, text, arm, *args, **kwargs):
        assert built.chosen_settings == settings.parse_all(settings_map.split(text))  # on while each arm runs
        if arm == failing:
            raise RuntimeError("it broke")
        return point(built, text, arm, *args, **kwargs)

    monkeypatch.setattr(settings, "apply", counted)
    monkeypatch.setattr(settings_map, "point", measured)
    assert cli.main(["settings", "--pipeline", "wan", "--try", "none", "--try", "layerwise_casting", "--calls", "1",
                     "--out", str(tmp_path)]) == 0
    once = ["on ", "off", "on layerwise_casting", "off"]
    assert turned == (once if failing is None else
                      ["on ", "off", "on ", "off", "on layerwise_casting", "off", "on layerwise_casting", "off"])
    found = {(x.setting, x.arm): x for x in results.read(tmp_path / "wan__tiny-2steps__cpu.json").points}
    assert len(found) == 4 and all(bool(x.error) == (x.arm == failing) for x in found.values())
    assert all(x.call_ms for x in found.values() if x.arm != failing)


def test_a_map_whose_every_point_is_refused_builds_nothing(tmp_path, capfd):
    from lab import cli

    assert cli.main(["settings", "--pipeline", "wan", "--try", "group_offload", "--try", "model_cpu_offload",
                     "--out", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert "not measured: `group_offload` on cpu" in err and "nothing to measure: no point asked for can run on cpu" \
        in err and "building" not in err
    assert not list(tmp_path.iterdir())


def test_a_ctrl_c_in_the_first_call_keeps_the_map_as_it_was(tmp_path, monkeypatch):
    from lab import cli, results
    from lab.measure import settings_map

    args = ["settings", "--pipeline", "wan", "--try", "none", "--calls", "1", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    path = tmp_path / "wan__tiny-2steps__cpu.json"
    before = results.read(path)

    def interrupted(built, seed):
        raise KeyboardInterrupt

    monkeypatch.setattr(settings_map, "_call", interrupted)
    assert cli.main([*args, "--try", "layerwise_casting", "--resume"]) == 130
    after = results.read(path)
    assert after.interrupted and after.first_calls_ms == before.first_calls_ms
    assert [(x.setting, x.arm, x.calls_ms) for x in after.points] == [
        (x.setting, x.arm, x.calls_ms) for x in before.points]


@pytest.mark.slow
def test_the_map_is_stored_as_it_grows(tmp_path, monkeypatch):
    """After each point the map so far is stored (marked interrupted until its last point), so that a process killed
    for memory keeps what it measured and `--resume` goes on from it."""
    from lab import cli
    from lab.pages import settings_map as page

    saved = []
    write_result = page.write_result
    monkeypatch.setattr(page, "write_result", lambda r, folder: saved.append(r) or write_result(r, folder))
    assert cli.main(["settings", "--pipeline", "wan", "--try", "none", "--try", "layerwise_casting", "--calls", "2",
                     "--slow", "0.001", "--out", str(tmp_path)]) == 0
    # a warm-up call past --slow is the point's one call (no call here offloads: none is profiled)
    assert all(len(x.calls_ms) == 1 and x.note.endswith("timed by its one call") for x in saved[-1].points)
    assert all(x.took_s > 0 for x in saved[-1].points)  # what each point took, for planning the next map
    # two saves per point, marked interrupted: before it, with the point stored as ended (what a process killed in it
    # leaves), and after it; then the finished map with its page
    assert [len(r.points) for r in saved] == [1, 1, 2, 2, 3, 3, 4, 4, 4]
    assert [r.interrupted for r in saved] == [True] * 8 + [False]
    assert [r.points[-1].ended for r in saved[:-1]] == [1, 0] * 4
    assert [(x.setting, x.arm) for x in saved[-1].points] == [
        ("none", "upstream"), ("none", "fixed"), ("layerwise_casting", "upstream"), ("layerwise_casting", "fixed")]


def test_an_offloaded_point_is_held_against_its_other_settings_without_offloading():
    """float8 storage with group offloading is set against float8 storage's own call (its upcasts are compute no
    copy hides); a point without other settings against the call without any; an arm not measured bare, upstream's."""
    from lab.measure.settings_map import compute_for, offloading

    compute = {("none", "upstream"): 680.0, ("none", "fixed"): 686.0, ("layerwise_casting", "fixed"): 782.0}
    assert offloading("layerwise_casting+group_offload-stream") and offloading("group_offload-leaf_level-stream")
    assert not offloading("layerwise_casting") and not offloading("none")
    assert compute_for("layerwise_casting+group_offload-stream", "fixed", compute) == 782.0
    assert compute_for("layerwise_casting+group_offload-stream", "upstream", compute) == 680.0  # its base not measured
    assert compute_for("model_cpu_offload", "fixed", compute) == 686.0
    assert compute_for("group_offload", "other", compute) == 680.0
    assert compute_for("group_offload", "fixed", {}) is None


LIMIT = {"call_ms": 1940.0, "compute_ms": 690.0, "h2d_bytes": 60_000_000_000, "d2h_bytes": 0, "h2d_gbs": 55.0,
         "d2h_gbs": 55.0, "multiple": 1.78}


def test_a_fixed_point_past_its_limit_without_its_device_split_is_measured_again():
    """`--resume` measures a kept fixed arm again where it is past 1.3x its limit and lacks what names its obstacle;
    one at its limit, one that has its split, an upstream arm and a setting not asked for stand."""
    from lab.measure.settings_map import _unexplained

    def kept(setting, arm, multiple, device=None):
        return {"setting": setting, "arm": arm, "offload": {**LIMIT, "multiple": multiple}, "device": device}

    points = [kept("group_offload", "fixed", 1.48), kept("group_offload", "upstream", 8.2),
              kept("group_offload-stream", "fixed", 1.13), kept("model_cpu_offload", "fixed", 1.5, {"kernels_us": 1.0}),
              kept("sequential_cpu_offload", "fixed", 1.44), {"setting": "none", "arm": "fixed", "offload": None}]
    texts = ["", "group_offload", "group_offload:stream", "model_cpu_offload"]
    assert _unexplained(points, texts) == {"group_offload"}
    # `--host-trace`: one that has its split but no host trace too, and one with both stands
    assert _unexplained(points, texts, host_trace=True) == {"group_offload", "model_cpu_offload"}
    points[3]["host_in_idle"] = {"idle_ms": 436.0}
    assert _unexplained(points, texts, host_trace=True) == {"group_offload"}
    # a slow point takes no host trace: measured again it would lack one again, so it stands
    points[3].pop("host_in_idle")
    points[3]["note"] = "a call takes 15 s: timed by its one call, profiled for its device activity only"
    assert _unexplained(points, texts, host_trace=True) == {"group_offload"}


def test_a_map_going_on_reads_its_kept_limits_again_at_the_rates_of_this_process():
    """The map records the rates of the process that wrote it, so every kept point's limit is read again at them, not
    at the rates the earlier process measured: a committed map going on at rates a tenth lower gives each offloaded
    point the lower rate, its copies' time at it, and a multiple of its limit no larger."""
    from pathlib import Path

    from lab import results
    from lab.measure.settings_map import going_on

    root = Path(__file__).resolve().parents[1] / "results" / "settings-map"
    prior = next(r for _, r in results.all_results(root, kind="settings-map")
                 if r.environment.copy_rates and any(p.offload for p in r.points))
    before = {(p.setting, p.arm): p.offload for p in prior.points if p.offload}
    slower = {k: v * 0.9 for k, v in prior.environment.copy_rates.items()}
    going = going_on(prior.scenario, prior, [], lambda _: None, rates=slower)
    after = {(p["setting"], p["arm"]): p["offload"] for p in going.kept if p["offload"]}
    assert set(after) == set(before)
    for key, limit in after.items():
        assert limit["h2d_gbs"] == slower["h2d_pinned"] and limit["d2h_gbs"] == slower["d2h_pinned"], key
        assert limit["h2d_ms"] == pytest.approx(limit["h2d_bytes"] / slower["h2d_pinned"] / 1e6), key
        assert limit["multiple"] <= before[key]["multiple"], key
    # without rates of its own (a CPU), the prior's stand
    same = going_on(prior.scenario, prior, [], lambda _: None)
    assert {p["offload"]["h2d_gbs"] for p in same.kept if p["offload"]} == {prior.environment.copy_rates["h2d_pinned"]}


def test_restat_reads_a_committed_maps_limits_again_at_its_own_rates(tmp_path):
    """`lab table --restat` on a map whose limits were read at another process's rates: each is read again at the
    rates the map records and the file written back, its measurements as they were; a map already so is not
    rewritten."""
    import shutil
    from pathlib import Path

    from lab.measure.settings_map import read_limits_again

    source = Path(__file__).resolve().parents[1] / "results" / "settings-map" / "ltx2__full-2steps__h100.json"
    path = tmp_path / source.name
    shutil.copy(source, path)
    read_limits_again(tmp_path)
    current, written = path.read_text(), path.stat().st_mtime_ns
    assert read_limits_again(tmp_path) == [] and path.stat().st_mtime_ns == written
    data = json.loads(current)
    for p in data["points"]:
        if p["offload"]:
            p["offload"] = {**p["offload"], "h2d_gbs": 40.0, "multiple": 9.0}
    path.write_text(json.dumps(data, indent=1) + "\n")
    moved = read_limits_again(tmp_path)
    assert moved and {m[3] for m in moved} == {9.0}
    again = json.loads(path.read_text())
    rate = again["environment"]["copy_rates"]["h2d_pinned"]
    assert {p["offload"]["h2d_gbs"] for p in again["points"] if p["offload"]} == {rate}
    assert [p["calls_ms"] for p in again["points"]] == [p["calls_ms"] for p in data["points"]]
    assert path.read_text() == current


def test_the_page_names_what_holds_a_point_past_its_limit():
    from lab.pages.settings_map import where_time_goes

    device = {"kernels_us": 700e3, "exposed_us": 1090e3, "device_us": 1790e3, "span_us": 1800e3, "HtoD_us": 1200e3,
              "DtoH_us": 0.0, "h2d_count": 1200, "d2h_count": 0, "profiled_ms": 1950.0}
    points = [SettingPoint(setting="group_offload", arm="fixed", call_ms=1940.0, peak_reserved_gb=1.7,
                           h2d_bytes=LIMIT["h2d_bytes"], d2h_bytes=0, offload=LIMIT, device=device),
              SettingPoint(setting="group_offload-stream", arm="fixed", call_ms=800.0, peak_reserved_gb=2.6,
                           offload={**LIMIT, "call_ms": 800.0, "multiple": 1.1}, h2d_bytes=LIMIT["h2d_bytes"],
                           d2h_bytes=0, device={**device, "exposed_us": 10e3, "profiled_ms": 810.0}),
              p("model_cpu_offload", "fixed", 1000.0, 24.0)]  # stored no split (an older map): no row
    lines = where_time_goes(points)
    rows = [x for x in lines if x.startswith("| `")]
    # 60 GB at 55 GB/s (1,091 ms) beside 690 ms of compute: the copies bound the limit; copies 1,200 ms, device
    # 1,790 ms: 590 ms of compute beside no copy, the largest part past the limit
    assert rows == [
        "| `group_offload` | fixed | 1,950 ms | 700 ms | 1,200 ms (1,090 ms) | 160 ms | 50.0 GB/s | 1.78x | compute "
        "beside no copy (copies and compute in turn) |",
        "| `group_offload-stream` | fixed | 810 ms | 700 ms | 1,200 ms (10 ms) | 0 ms | 50.0 GB/s | 1.10x | (at its "
        "limit) |"]
    assert where_time_goes(points[2:]) == []


@pytest.mark.slow
@pytest.mark.parametrize("slow_s", [1e6, 1e-6], ids=["timed-then-profiled", "one-profiled-call"])
def test_a_profiled_point_stores_its_device_split_and_keeps_its_trace(tmp_path, slow_s):
    """The path an offloading point takes on a GPU, run on the CPU (its operators profiled in place of the device's
    activity): timed calls then one profiled call, or a slow warm-up call alone, profiled; either way the point
    stores the copies and device split its trace gives and the trace is kept where asked."""
    from lab.measure.settings_map import point
    from lab.run.scenario import build, get_scenario
    from lab.traces.trace import load

    built = build(get_scenario("wan"), size="tiny", device="cpu", steps=1, seed=0)
    built.pipe.set_progress_bar_config(disable=True)
    built.chosen_settings = []
    keep = tmp_path / "kept" / "copies.json.gz"
    found = point(built, "", "upstream", [], calls=2, seed=0, slow_s=slow_s, compute_ms=None, rates=None, keep=keep,
                  profile=True)
    assert found["h2d_bytes"] == 0 and found["d2h_bytes"] == 0  # a CPU copies nothing to a device
    assert set(found["device"]) >= {"kernels_us", "exposed_us", "device_us", "HtoD_us", "profiled_ms"}
    assert found["device"]["profiled_ms"] > 0
    assert len(found["calls_ms"]) == (1 if slow_s < 1 else 2)
    if slow_s < 1:
        assert found["device"]["profiled_ms"] == found["calls_ms"][0]
        assert found["note"].endswith("timed by its one call, profiled for its device activity only")
    else:
        assert not found.get("note")
    assert len(load(keep).cat("cpu_op")) > 0
    assert "host_in_idle" not in found  # none asked for

    # `--host-trace`: a point not slow takes one more call with the host's Python functions, its trace kept beside
    # the other; on a CPU there is no device to sit idle, which it says; a slow point takes none
    found = point(built, "", "upstream", [], calls=1, seed=0, slow_s=slow_s, compute_ms=None, rates=None, keep=keep,
                  profile=True, host_trace=True)
    hosted = keep.with_name("copies__host.json.gz")
    if slow_s < 1:
        assert "host_in_idle" not in found and not hosted.exists()
    else:
        idle = found["host_in_idle"]
        assert idle["call_ms"] > 0 and idle["idle_ms"] == 0 and idle["gaps"] == 0
        assert any("no GPU activity" in n for n in idle["notes"])
        assert len(load(hosted).cat("python_function")) > 0


def test_the_page_says_what_the_host_did_while_the_device_sat_idle():
    from lab.pages.settings_map import host_in_idle

    traced = SettingPoint(setting="model_cpu_offload", arm="fixed", call_ms=1805.0, peak_reserved_gb=41.5,
                          host_in_idle={"call_ms": 2400.0, "idle_ms": 436.0, "gaps": 12, "notes": [],
                                        "callers": [{"function": "accelerate/hooks.py:160 pre_forward",
                                                     "inclusive_ms": 300.0}],
                                        "functions": [{"function": "<built-in method to>", "self_ms": 250.0}]})
    lines = host_in_idle([traced, SettingPoint(setting="none", arm="fixed", call_ms=700.0, peak_reserved_gb=41.8)])
    assert lines[-1] == ("| `model_cpu_offload` | fixed | 2,400 ms | 436 ms (12) | `accelerate/hooks.py:160 "
                         "pre_forward` 300 ms | `<built-in method to>` 250 ms |")
    assert len([line for line in lines if line.startswith("| `")]) == 1 and host_in_idle([]) == []


class _Killed(BaseException):
    """What a process killed for memory does to the map: it ends in the point, and no handler runs."""


@pytest.mark.slow
def test_a_point_the_process_ended_in_is_measured_last_and_then_kept_as_a_failure(tmp_path):
    """A map stores each point as ended before it measures it, so that a process killed in one (for the host's memory:
    it cannot say so itself) leaves that said. Going on, that point is measured after every other one; where the
    process ends in it again, it stays a failure and is not measured again, and the map goes on past it."""
    from lab import cli, results
    from lab.measure import settings_map

    point = settings_map.point
    order = []

    def killed_in(setting):
        def measure(built, text, arm, *args, **kwargs):
            order.append((settings_map.tag(text), arm))
            if (settings_map.tag(text), arm) == (setting, "fixed"):
                raise _Killed
            return point(built, text, arm, *args, **kwargs)
        return measure

    args = ["settings", "--pipeline", "wan", "--try", "none", "--try", "layerwise_casting", "--calls", "1", "--out",
            str(tmp_path)]
    path = tmp_path / "wan__tiny-2steps__cpu.json"
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(settings_map, "point", killed_in("none"))
        with pytest.raises(_Killed):
            cli.main(args)
    first = {(x.setting, x.arm): x for x in results.read(path).points}
    assert first["none", "fixed"].ended == 1 and first["none", "fixed"].error.startswith(
        "the process ended while measuring it (1 time(s)): killed")
    assert set(first) == {("none", "upstream"), ("none", "fixed")}

    # going on and cut short before it: what the map says of it stays
    def interrupted(built, text, arm, *args, **kwargs):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(settings_map, "point", interrupted)
        assert cli.main([*args, "--resume"]) == 130
    assert {(x.setting, x.arm): x for x in results.read(path).points}["none", "fixed"].ended == 1

    # going on: the setting it ended in last, though the map lists it first, and measured this time
    order.clear()
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(settings_map, "point", killed_in(""))
        assert cli.main([*args, "--resume"]) == 0
    assert order == [("layerwise_casting", "upstream"), ("layerwise_casting", "fixed"), ("none", "fixed")]
    second = {(x.setting, x.arm): x for x in results.read(path).points}
    assert not second["none", "fixed"].error and second["none", "fixed"].call_ms > 0
    assert "the process ended while measuring it before" in second["none", "fixed"].note
    assert second["none", "upstream"].calls_ms == first["none", "upstream"].calls_ms  # kept

    # ended twice: kept as a failure, not measured a third time
    stored = json.loads(path.read_text())
    stored["points"] = [x for x in stored["points"] if (x["setting"], x["arm"]) != ("layerwise_casting", "fixed")]
    path.write_text(json.dumps(stored))
    for tries in (1, 2):
        order.clear()
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(settings_map, "point", killed_in("layerwise_casting"))
            with pytest.raises(_Killed):
                cli.main([*args, "--resume"])
        assert order == [("layerwise_casting", "fixed")]
        assert {(x.setting, x.arm): x for x in results.read(path).points}["layerwise_casting", "fixed"].ended == tries
    order.clear()
    assert cli.main([*args, "--resume"]) == 0
    assert order == []
    last = {(x.setting, x.arm): x for x in results.read(path).points}
    assert last["layerwise_casting", "fixed"].ended == 2 and "(2 time(s))" in last["layerwise_casting", "fixed"].error
    page = (tmp_path / "wan__tiny-2steps__cpu.md").read_text()
    assert "| `layerwise_casting` | fixed |" in page and "failed: the process ended while measuring it" in page


def test_the_results_page_answers_each_memory_budget_from_every_committed_map():
    """`lab table`'s "which setting for your GPU memory": one column per committed map, each cell the map's fastest
    point within the budget (`fastest_within`), a map cut short marked partial, and a budget nothing measured fits
    said so."""
    from pathlib import Path

    import msgspec

    from lab import results
    from lab.pages import settings_map as page

    root = Path(__file__).resolve().parents[1] / "results"
    maps = results.all_results(root / "settings-map", kind="settings-map")
    lines = page.budget_table(maps, root)
    assert len(lines) == 2 + len(page.BUDGETS_GB) and lines[0].count("](settings-map/") == len(maps) >= 4
    assert [("(partial)" in head) for head in lines[0].split(" | ")[1:]] == [r.interrupted for _, r in maps]
    for budget, line in zip(page.BUDGETS_GB, lines[2:]):
        for (_, r), cell in zip(maps, line.strip("| ").split(" | ")[1:]):
            best = page.fastest_within(r.points, budget)
            assert cell.startswith(f"`{best.setting}`{' + fixes' if best.arm == 'fixed' else ''}: ") if best else \
                cell == "nothing measured fits", (budget, r.scenario, cell)
    path, first = maps[0]
    empty = page.budget_table([(path, msgspec.structs.replace(first, points=[]))], root)
    assert all(line.endswith("| nothing measured fits |") for line in empty[2:])

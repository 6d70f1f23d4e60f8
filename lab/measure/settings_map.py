"""Which setting should a user run? Each memory and speed setting of one pipeline, upstream and with the catalog's
fixes, measured on one build as the peak GPU memory and the time of its calls (`lab settings --pipeline`).

Before the first point, one call with nothing on that no point is timed by (`first_calls_ms`): a process's first call
pays for loading kernels, library handles and the allocator's growth, which would otherwise fall on whichever point
comes first (the setting-less one, which every offload limit is set against). For each setting (and each pair of
settings that compose), in turn on the same build: the setting turned on as the lab turns it on for an A/B
(`lab.run.settings.apply`), once for both arms as an A/B keeps it on while its fixes come and go (turning an
offloading mode on and off copies the whole model each way), and off after the last arm or after one that fails; then
each arm: upstream (no fix) and fixed (every fix of the catalog that applies to the pipeline in that setting, the one
that includes another where two conflict); one warm-up call, then `calls` timed calls between which the allocator's
peak is taken (`torch.cuda.max_memory_allocated` and `max_memory_reserved`, reset before the first), and in an
offloading setting one call profiled for its device activity alone (CUDA activity only, which costs the call next to
nothing): its bytes each way give its offload limit against the call without any setting
(`lab.verdicts.offload_limit`), and where its device time went (kernels, copies beside no kernel, idle:
`lab.traces.transfers.device_split`) names what holds a call above that limit. A setting whose warm-up call alone
takes `slow_s` or more is timed by that call alone, profiled (its `note` says so): upstream group offloading without a
stream takes tens of seconds a call at true size, and its first call copies as the others do. A point that fails (out
of memory, a setting the pipeline refuses) keeps its error and the map goes on; a Ctrl-C keeps the points done.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

#: what `lab settings --pipeline` measures unless told otherwise: none, each offloading mode diffusers offers, the
#: float8 storage, and the pairs users compose (float8 storage with a streamed group offload)
DEFAULT_SETTINGS = ("", "model_cpu_offload", "sequential_cpu_offload", "group_offload", "group_offload:stream",
                    "group_offload:leaf_level", "group_offload:leaf_level,stream", "layerwise_casting",
                    "layerwise_casting;group_offload:stream")
#: a warm-up call at least this long is the setting's one timed call, which its note says in these words
SLOW_S = 20.0
ONE_CALL = "timed by its one call"
#: a point the process ended in (killed: for the host's memory, most likely) this many times is kept as a failure and
#: not measured again; once, it is measured again after every other point of the map, where it can cost no other
ENDED_TRIES = 2


def split(texts: str) -> list[str]:
    """A point's settings from its text: several settings joined by `;` compose, `""` is none."""
    return [t for t in texts.split(";") if t]


def fixed_set(pipeline: str, settings: Sequence[str]) -> list:
    """The catalog's fixes for `pipeline` in `settings` (as results record them: `Setting.describe()`): each one
    that applies, a fix that includes another it
    conflicts with taking its place (`model_offload_pinned` over `model_offload_keep_host`), none that changes the
    outputs on purpose."""
    from lab.apply.fix import catalog, check_fixes_for

    ordered = sorted(catalog().values(), key=lambda f: (not f.conflicts, f.name))  # the including fix first
    fixes, _ = check_fixes_for(pipeline, ordered, skip_inapplicable=True, settings=list(settings))
    return [f for f in fixes if not getattr(f, "changes_outputs", "")]


def copies(built: Any, seed: int, fixes: list, *, keep: Path | None = None) -> tuple[float, dict]:
    """One call profiled for its device activity alone: its wall time and what `read_profile` reads of it."""
    from lab.apply.fix import applied

    with applied(fixes, built.pipe), profiler(built) as prof:
        wall = _call(built, seed)
    return wall, read_profile(prof, keep)


def read_profile(prof: Any, keep: Path | None = None) -> dict:
    """What a call profiled for its CUDA activity alone (which costs it next to nothing: no host events) copied and
    where its device time went: the bytes and count of its copies each way (`lab.traces.transfers`) and
    `device_split`'s parts. `keep`: where its trace is kept (gzipped), else it is dropped."""
    from lab.traces.transfers import device_split, transfer_analysis

    trace = _exported(prof, keep)
    found = transfer_analysis(trace)
    return {"h2d_bytes": found["HtoD"]["bytes"], "d2h_bytes": found["DtoH"]["bytes"],
            "h2d_count": found["HtoD"]["count"], "d2h_count": found["DtoH"]["count"], **device_split(trace)}


def _exported(prof: Any, keep: Path | None) -> Any:
    """The trace of a finished profiler, read (`lab.traces.trace.load`); kept gzipped at `keep` where given."""
    from lab.traces.trace import load

    with tempfile.TemporaryDirectory(prefix="lab-settings-") as folder:
        path = Path(folder) / "call.json"
        prof.export_chrome_trace(str(path))
        trace = load(path)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as f, gzip.open(keep, "wb") as out:
                shutil.copyfileobj(f, out)
    return trace


def host_in_idle(built: Any, seed: int, fixes: list, *, keep: Path | None = None) -> dict:
    """One more call, profiled with the host's Python functions beside the device's activity (which slows the call:
    it is timed for nothing): what the host did while the device sat idle (`lab.traces.gaps`: the GPU idle gaps
    over 100 µs, the functions with the most self time in them and the callers with the most inclusive time), the
    profiled call's time, and why a part is missing (no GPU activity on a CPU). `keep`: where its trace is kept."""
    import torch

    from lab.apply.fix import applied
    from lab.traces import gaps

    activities = [torch.profiler.ProfilerActivity.CPU]
    if built.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with applied(fixes, built.pipe), torch.profiler.profile(activities=activities, with_stack=True) as prof:
        wall = _call(built, seed)
    found = gaps.attribute(_exported(prof, keep), sources=("gpu idle",))
    idle = [k for k in found["kinds"] if k["source"] == "gpu idle"]
    return {"call_ms": wall, "idle_ms": sum(k["total_us"] for k in idle) / 1e3, "gaps": sum(k["gaps"] for k in idle),
            "functions": gaps.top_functions(found, "gpu idle", top=5),
            "callers": gaps.top_callers(found, "gpu idle", top=5), "notes": found["notes"]}


def profiler(built: Any) -> Any:
    """A profiler of the device's activity alone on `built`'s device (CUDA; on a CPU its operators, so that the
    path runs where there is no GPU)."""
    import torch

    cuda = built.device.startswith("cuda")
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if cuda else
                                              torch.profiler.ProfilerActivity.CPU])


def _read(read: Callable[[], Any], what: str = "its copies") -> tuple[Any, str]:
    """What `read()` gives, or None and why `what` could not be read: a point whose profile fails keeps its times."""
    try:
        return read(), ""
    except Exception as e:  # noqa: BLE001
        return None, f"{what} could not be read: {type(e).__name__}: {e}"


def _call(built: Any, seed: int) -> float:
    from lab.run.runner import timed_call

    return timed_call(built, seed=seed, marks=False).wall_ms


def point(built: Any, text: str, arm: str, fixes: list, *, calls: int, seed: int, slow_s: float,
          compute_ms: float | None, rates: dict | None, keep: Path | None = None,
          profile: bool | None = None, host_trace: bool = False) -> dict:
    """One setting in one arm, on `built` with the setting already on (module docstring). An offloading setting's
    warm-up call is profiled for its device activity: where it takes `slow_s` or more, it is the point's one call
    and gives its copies; else the timed calls follow and then one profiled call. `keep`: where the profiled call's
    trace is kept; `profile`: whether its calls are profiled (default: where it offloads on a GPU). `host_trace`: a
    profiled point not slow takes one more call for what the host did while the device sat idle (`host_in_idle`,
    its trace kept beside the other as `...__host.json.gz`); a slow one takes none, which would cost it minutes."""
    import torch

    from lab.apply.fix import applied
    from lab.run.settings import GROUP
    from lab.verdicts import stats
    from lab.verdicts.offload_limit import offload_limit

    out: dict[str, Any] = {"setting": tag(text), "arm": arm, "settings": [s.describe() for s in built.chosen_settings],
                           "fixes": [f.name for f in fixes]}
    cuda = built.device.startswith("cuda")
    offloads = cuda and any(GROUP.get(s.name) == "offloading" for s in built.chosen_settings)
    profile = offloads if profile is None else profile
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    found, profiled_ms, problem = None, None, ""
    prof = profiler(built) if profile else None
    with applied(fixes, built.pipe):
        with prof or contextlib.nullcontext():
            first = _call(built, seed)
        slow = first >= slow_s * 1e3
        walls = [first] if slow else [_call(built, seed) for _ in range(calls)]
    if profile and slow:
        found, problem = _read(lambda: read_profile(prof, keep))
        profiled_ms = first
    elif profile:
        got, problem = _read(lambda: copies(built, seed, fixes, keep=keep))
        if got is not None:
            profiled_ms, found = got
    if found is not None:
        out.update(h2d_bytes=found.pop("h2d_bytes"), d2h_bytes=found.pop("d2h_bytes"),
                   device={**found, "profiled_ms": profiled_ms})
    if host_trace and profile and not slow:
        hosted = keep.with_name(keep.name.replace(".json.gz", "__host.json.gz")) if keep is not None else None
        idle, why = _read(lambda: host_in_idle(built, seed, fixes, keep=hosted), "its host trace")
        if idle is not None:
            out["host_in_idle"] = idle
        problem = "; ".join(filter(None, [problem, why]))
    if slow:
        out["note"] = (f"a call takes {first / 1e3:,.0f} s: {ONE_CALL}"
                       + (", profiled for its device activity only" if profile else ""))
    if problem:
        out["note"] = "; ".join(filter(None, [out.get("note", ""), problem]))
    if cuda:
        out.update(peak_allocated_gb=torch.cuda.max_memory_allocated() / 1e9,
                   peak_reserved_gb=torch.cuda.max_memory_reserved() / 1e9)
    out.update(calls_ms=walls, call_ms=stats.median(walls))
    if offloads and compute_ms and rates and out.get("h2d_bytes") is not None:
        out["offload"] = offload_limit(out["call_ms"], compute_ms, out["h2d_bytes"], out["d2h_bytes"], rates).to_dict()
    return out


def tag(text: str) -> str:
    """A point's settings as results name them (`group_offload-stream`, `layerwise_casting+group_offload-stream`),
    `none` for none."""
    from lab.run import settings

    parsed = settings.parse_all(split(text))
    return "+".join(s.tag() for s in parsed) or "none"


def measure(built: Any, pipeline: str, texts: Sequence[str], *, calls: int = 2, seed: int = 0, slow_s: float = SLOW_S,
            rates: dict | None = None, progress: Callable[[str], None] = print,
            compute_ms: dict[tuple[str, str], float] | None = None,
            arms: dict[str, tuple[str, ...]] | None = None,
            done: Callable[[list[dict]], None] | None = None,
            keep: Callable[[str, str], Path] | None = None,
            ended: dict[tuple[str, str], int] | None = None, host_trace: bool = False) -> tuple[list[dict], bool]:
    """Every point of the map on `built` (built with no setting on), in the order of `texts`, the setting-less one
    first where it is asked for (the calls without offloading are the compute its offload limits are set against,
    `compute_for`; `compute_ms`: those calls, where a map going on from an earlier one has them already); `arms`: the
    arms to measure of a text, where not both; `done(points)` before each point, with that point stored as ended
    (`ended_point`: what a process killed in it leaves; `ended`, by setting and arm, the times it ended before), and
    after it (the map is stored as it grows, so that a process killed for memory keeps what it measured). Each point
    stores the process's peak host memory over it (`host_peak_gb`, where Linux lets the peak be reset). What a fix
    keeps across its turns (pinned copies of the weights) is let go once its setting is undone
    (`lab.apply.fix.release`), and the pinned memory torch's host allocator caches is given back: the host would
    otherwise hold one pinned copy of the model per offloading mode. `keep(tag, arm)`: where an offloading point's profiled trace is kept.
    Each setting is turned on once for its arms and off after the last (or after an arm that fails: `_SettingOn`), so
    `took_s` holds turning it on in its first arm and off in its last. Returns the points and whether a Ctrl-C cut
    the map short."""

    from lab.run import settings

    # the setting-less point first (the compute of the others' limits), and a setting the process ended in last
    ended = ended or {}
    again = {setting for (setting, _), n in ended.items() if n < ENDED_TRIES}
    ordered = sorted(texts, key=lambda t: (tag(t) in again, t != ""))
    compute = dict(compute_ms or {})  # (a setting without offloading, arm) -> its call
    points: list[dict] = []
    try:
        for text in ordered:
            chosen = settings.parse_all(split(text))
            fixes_of = {arm: fixed_set(pipeline, [s.describe() for s in chosen]) if arm == "fixed" else []
                        for arm in (arms or {}).get(text, ("upstream", "fixed"))}
            if "fixed" in fixes_of and not fixes_of["fixed"]:
                progress(f"{tag(text)}: no fix of the catalog applies in it; its fixed arm is its upstream one")
                del fixes_of["fixed"]
            on = _SettingOn(chosen, built)
            try:
                for n, (arm, fixes) in enumerate(fixes_of.items(), start=1):
                    progress(f"{tag(text)}, {arm}" + (f" ({', '.join(f.name for f in fixes)})" if fixes else "")
                             + " ...")
                    if done is not None:  # stored as ended until it is measured: a process killed in it says so
                        done(points + [ended_point(tag(text), arm, chosen, fixes, ended.get((tag(text), arm), 0))])
                    found = _arm(built, text, arm, fixes, on, last=n == len(fixes_of), calls=calls, seed=seed,
                                 slow_s=slow_s, compute_ms=compute_for(tag(text), arm, compute), rates=rates,
                                 keep=keep(tag(text), arm) if keep is not None else None, host_trace=host_trace)
                    if ended.get((tag(text), arm)) and not found.get("error"):
                        found["note"] = "; ".join(filter(None, [found.get("note", ""), (
                            "the process ended while measuring it before (killed): measured again after the map's "
                            "other points")]))
                    points.append(found)
                    if found.get("call_ms") and not found.get("error") and not offloading(found["setting"]):
                        compute[found["setting"], arm] = found["call_ms"]
                    progress("  " + summary(found))
                    if done is not None:
                        done(points)
            finally:
                on.off()  # (cut short between its arms)
    except KeyboardInterrupt:
        progress(f"interrupted: keeping the {len(points)} point(s) done")
        return points, True
    return points, False


def _arm(built: Any, text: str, arm: str, fixes: list, on: _SettingOn, *, last: bool, **measuring: Any) -> dict:
    """One arm of a point (`point`, with `measuring` its options), its setting turned on first where it is not yet
    (`on`), and off after the last arm, or after one that failed or was cut short, whose state is unknown (the next
    arm turns it on afresh); what the arm kept (pinned copies, torch's cached pinned host memory) let go. A failure
    (out of memory, a setting refused) is the point's error. Adds what it took and the process's host peak over it."""
    import torch

    from lab.apply.fix import release
    from lab.base import host_memory

    started, host, found = time.perf_counter(), host_memory.reset_peak(), None
    try:
        on.ensure()
        found = point(built, text, arm, fixes, **measuring)
    except torch.cuda.OutOfMemoryError as e:
        found = {"setting": tag(text), "arm": arm, "fixes": [f.name for f in fixes],
                 "error": f"out of memory: {str(e).splitlines()[0]}"}
    except Exception as e:  # noqa: BLE001 (a setting that fails here keeps the others)
        found = {"setting": tag(text), "arm": arm, "fixes": [f.name for f in fixes],
                 "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    finally:
        if last or found is None or found.get("error"):
            on.off()
        release(fixes)
        gc.collect()
        host_memory.empty_host_cache()  # what the arm pinned (upstream's stream path too) goes back
    found["took_s"] = time.perf_counter() - started  # the setting on (its first arm) and off (its last)
    found["host_peak_gb"] = host_memory.peak_gb() if host else None
    return found


class _SettingOn:
    """A point's settings on `built`, turned on once for its arms (`ensure`), as an A/B keeps a setting on while its
    fixes come and go: turning an offloading mode on and off copies the whole model each way, most of what a point
    took when each arm turned it on. `off` undoes it (`lab.run.settings.apply`'s undo), where it is on."""

    def __init__(self, chosen: list, built: Any) -> None:
        self.chosen, self.built, self.undo = chosen, built, None

    def ensure(self) -> None:
        from lab.run import settings

        if self.undo is None:
            self.undo = settings.apply(self.chosen, self.built)
            self.built.chosen_settings = self.chosen

    def off(self) -> None:
        undo, self.undo = self.undo, None
        try:
            if undo is not None:
                undo()
        finally:
            self.built.chosen_settings = []


def ended_point(setting: str, arm: str, chosen: Sequence, fixes: Sequence, before: int) -> dict:
    """The record of a point stored before it is measured: what the map says of it if the process ends in it (a
    process killed for memory cannot say so itself), the times it ended counted with those `before`."""
    from lab.base import host_memory

    total = host_memory.total_gb()
    return {"setting": setting, "arm": arm, "settings": [s.describe() for s in chosen],
            "fixes": [f.name for f in fixes], "ended": before + 1,
            "error": f"the process ended while measuring it ({before + 1} time(s)): killed, most likely for the "
                     "host's memory" + (f" ({total:,.0f} GB)" if total else "")}


def summary(found: dict) -> str:
    took = f" ({found['took_s']:,.0f} s)" if found.get("took_s") is not None else ""
    if found.get("error"):
        return f"failed: {found['error']}{took}"
    memory = f", peak {found['peak_reserved_gb']:,.1f} GB reserved" if found.get("peak_reserved_gb") is not None else ""
    limit = f", {found['offload']['multiple']:.2f}x its overlap limit" if found.get("offload") else ""
    return f"{found['call_ms']:,.1f} ms per call{memory}{limit}{took}"


def offloading(setting_tag: str) -> bool:
    """Whether a point's settings (its tag) offload weights."""
    from lab.run.settings import GROUP

    return any(GROUP.get(part.split("-")[0]) == "offloading" for part in setting_tag.split("+"))


def compute_for(setting_tag: str, arm: str, compute: dict[tuple[str, str], float]) -> float | None:
    """The compute an offloaded point's limit is set against: the same arm's call in the point's other settings
    without offloading (float8 storage's own call for float8 storage with group offloading: its upcasts are compute
    that no copy can hide), else the arm's call without any setting, else the upstream one."""
    base = "+".join(part for part in setting_tag.split("+") if not offloading(part)) or "none"
    for key in ((base, arm), ("none", arm), ("none", "upstream")):
        if key in compute:
            return compute[key]
    return None


def computed(result: Any) -> dict[tuple[str, str], float]:
    """Each call without offloading in a stored map, by its setting and arm: the compute its offload limits are set
    against (`compute_for`)."""
    return {(p.setting, p.arm): p.call_ms for p in result.points
            if p.call_ms and not p.error and not offloading(p.setting)}


def limits_again(points: list[dict], compute: dict[tuple[str, str], float], rates: dict | None) -> None:
    """Each offloading point's limit read again (in place) from what it stores (its call and its copies), the host's
    rates and the compute `compute_for` gives it: a map going on from an earlier one holds its kept points to the
    rule of now."""
    from lab.verdicts.offload_limit import offload_limit

    for p in points:
        against = compute_for(p["setting"], p["arm"], compute)
        if p.get("offload") is not None and against and rates and p.get("call_ms") and p.get("h2d_bytes") is not None:
            p["offload"] = offload_limit(p["call_ms"], against, p["h2d_bytes"], p["d2h_bytes"], rates).to_dict()


def read_limits_again(maps_dir: Path) -> list[tuple[str, str, str, float, float]]:
    """Each committed map's offloaded points' limits read again from what each stores (its call, its copies, the
    compute its map measured), at the copy rates the map records, and the map written back where one moved (`lab
    table --restat`): the page gives every limit at the rates it states. The measurements are not touched.
    (map, setting, arm, multiple before, after) for each limit that moved."""
    import json

    from lab import results

    moved = []
    for path, stored in results.all_results(maps_dir, kind="settings-map"):
        data = json.loads(path.read_text())
        before = [p.get("offload") for p in data["points"]]
        limits_again(data["points"], computed(stored), stored.environment.copy_rates)
        changed = [(stored.name, p["setting"], p["arm"], was["multiple"], p["offload"]["multiple"])
                   for p, was in zip(data["points"], before) if was and p["offload"] != was]
        if changed:
            results.write(path, data, replace=True)
            moved += changed
    return moved


def _stale(pipeline: str, kept: list[dict], texts: Sequence[str]) -> dict[str, tuple[list[str], list[str]]]:
    """The settings among `texts` whose kept fixed point ran other fixes than the catalog gives it now (a fix added
    since, or one that includes another): by tag, (the fixes it ran, the fixes now). Their fixed arm is measured
    again; their upstream one stands."""
    asked = {tag(t) for t in texts}
    stale = {}
    for p in kept:
        if p["arm"] == "fixed" and p["setting"] in asked:
            now = [f.name for f in fixed_set(pipeline, p["settings"])]
            if sorted(now) != sorted(p["fixes"]):
                stale[p["setting"]] = (p["fixes"], now)
    return stale


def _unexplained(kept: list[dict], texts: Sequence[str], host_trace: bool = False) -> set[str]:
    """The settings among `texts` whose kept fixed point is past its limit (`AT_LIMIT`) and lacks its device split (a
    map measured before points stored one), or with `host_trace` its host trace where it would take one (a slow
    point, timed by its one call, takes none: measured again, it would still lack it): their fixed arm is measured
    again, so that the page can name what holds it there."""
    from lab.verdicts.offload_limit import AT_LIMIT

    def untraced(p: dict) -> bool:
        return host_trace and not p.get("host_in_idle") and ONE_CALL not in p.get("note", "")

    asked = {tag(t) for t in texts}
    return {p["setting"] for p in kept if p["arm"] == "fixed" and p["setting"] in asked and p.get("offload")
            and p["offload"]["multiple"] > AT_LIMIT and (not p.get("device") or untraced(p))}


class GoingOn(NamedTuple):
    """What a map going on from an earlier one (`lab settings --resume`) keeps and measures: the points it keeps
    (`kept`), the settings it measures afresh (`todo`) and those with an arm to measure (`again`, the arms in `arms`),
    the kept fixed arms it measures again (`replaced`, by setting and arm: where the catalog's fixes changed for one,
    `stale`, with the fixes it ran and the fixes now, or where it lacks what names its obstacle), and the points the
    process ended in before (`ended`: measured again last, their records kept till then in `unfinished`, or kept as
    failures at `ENDED_TRIES`)."""

    kept: list[dict]
    todo: list[str]
    again: list[str]
    arms: dict[str, tuple[str, ...]]
    stale: dict[str, tuple[list[str], list[str]]]
    replaced: dict[tuple[str, str], dict]
    ended: dict[tuple[str, str], int] = {}  # (setting, arm) -> the times the process ended while measuring it
    unfinished: list[dict] = []  # the records of the points it ended in, to measure again: kept until they are

    def merged(self, new: list[dict]) -> list[dict]:
        """The map's points with `new` measured: each kept one, each new one (beside its setting's other arm), and
        each arm measured again in place of the kept one, except where measuring it again failed or did not happen
        (a Ctrl-C before it): then the kept one stays, with why where it failed. Nothing measured is lost."""
        new = [{**self.replaced[p["setting"], p["arm"]], "ended": p.get("ended", 0),
                "note": "; ".join(filter(None, [self.replaced[p["setting"], p["arm"]].get("note", ""),
                                                f"measuring it again failed: {p['error']}"]))}
               if p.get("error") and (p["setting"], p["arm"]) in self.replaced else p for p in new]
        for p in new:
            if p["setting"] in self.stale and p["arm"] == "fixed" and not any(
                    said in p.get("note", "") for said in ("measured again", "measuring it again failed")):
                was = ", ".join(self.stale[p["setting"]][0])
                p["note"] = "; ".join(filter(None, [p.get("note", ""), "measured again with the catalog's fixes of "
                                                                       f"now (an earlier map's fixed arm ran {was})"]))
        measured = {(p["setting"], p["arm"]) for p in new}
        points = self.kept + new + [p for key, p in self.replaced.items() if key not in measured] + [
            p for p in self.unfinished if (p["setting"], p["arm"]) not in measured]
        order = {s: i for i, s in reversed(list(enumerate(p["setting"] for p in points)))}  # where each came first
        points.sort(key=lambda p: (order[p["setting"]], p["arm"] != "upstream"))  # a fixed arm beside its upstream
        return points


def going_on(pipeline: str, prior: Any, texts: Sequence[str], progress: Callable[[str], None] = print, *,
             host_trace: bool = False, rates: dict | None = None) -> GoingOn:
    """What a map of `texts` going on from `prior` (None: a map afresh) keeps and measures (`GoingOn`), said;
    `host_trace`: a kept fixed arm past its limit without a host trace is measured again for one (`_unexplained`).
    `rates`: the host's copy rates in this process, at which the kept points' limits are read again, since the map
    records this process's rates and its page gives every limit at them (None, as on a CPU: the prior's)."""
    import msgspec

    # a point the process ended in `ENDED_TRIES` times stays a failure; any other failure is measured again
    stored = [msgspec.to_builtins(p) for p in prior.points] if prior is not None else []
    kept = [p for p in stored if not p["error"] or p["ended"] >= ENDED_TRIES]
    unfinished = [p for p in stored if p["error"] and 0 < p["ended"] < ENDED_TRIES]
    ended = {(p.setting, p.arm): p.ended for p in prior.points if p.ended} if prior is not None else {}
    if prior is not None:
        limits_again(kept, computed(prior), rates or prior.environment.copy_rates)
    done = {p["setting"] for p in kept}
    todo = [t for t in texts if tag(t) not in done]
    stale = _stale(pipeline, kept, [t for t in texts if tag(t) in done])
    unexplained = _unexplained(kept, [t for t in texts if tag(t) in done], host_trace) - set(stale)
    given_up = {s for (s, arm), n in ended.items() if arm == "fixed" and n >= ENDED_TRIES}
    again_fixed = (set(stale) | unexplained) - given_up
    replaced = {(p["setting"], p["arm"]): p for p in kept if p["arm"] == "fixed" and p["setting"] in again_fixed}
    kept = [p for p in kept if (p["setting"], p["arm"]) not in replaced]
    # a setting kept with one arm only (a map cut short between its arms): the other arm, where it has fixes
    has = {(p["setting"], p["arm"]) for p in kept}
    arms = {t: tuple(a for a in ("upstream", "fixed") if (tag(t), a) not in has) for t in texts if tag(t) in done}
    again = [t for t in texts if arms.get(t)]
    # a setting the process ended in is measured after every other (`measure` orders them by `ended`)
    last = {setting for (setting, _), n in ended.items() if n < ENDED_TRIES}
    if prior is not None:
        progress(f"going on from {prior.name}: {len(done)} setting(s) kept, {len(todo)} to measure"
                 + (f", {len(again)} with an arm to measure" if again else "")
                 + "".join(f"; {t}: the catalog's fixes for it are now {', '.join(now)} (were {', '.join(was)}), its "
                           "fixed arm measured again" for t, (was, now) in stale.items())
                 + (f"; the fixed arm of {', '.join(sorted(unexplained))} measured again for where its time goes"
                    if unexplained else "")
                 + (f"; measured after the others, as the process ended while measuring them: "
                    f"{', '.join(sorted(last))}" if last else ""))
    return GoingOn(kept, todo, again, arms, stale, replaced, ended, unfinished)


def run_map(scenario: Any, *, size: str, layers: int | None, steps: int, device: str, texts: Sequence[str],
            calls: int, seed: int, slow_s: float, command: str, progress: Callable[[str], None] = print,
            prior: Any = None, save: Callable[[Any], None] | None = None, trace_dir: Path | None = None,
            host_trace: bool = False):
    """The settings map of `scenario` (`SettingsMapResult`): one build with no setting on, every point in turn. With
    `prior` (an earlier map of the same pipeline, size, steps and device), its points are kept and only the points it
    lacks are measured (`lab settings --resume`), and the fixed arms the catalog's fixes changed for or that lack what
    names their obstacle (`_stale`, `_unexplained`); the commands of both are kept. `save(map)` after each point, with
    the map so far (marked `interrupted` until its last point). `trace_dir`: where each offloading point's profiled
    trace is kept (`<map>__<setting>__<arm>.json.gz`). `host_trace`: each offloading point not slow also records what
    the host did while the device sat idle (`point`, `host_in_idle`)."""
    import msgspec
    import torch

    from lab import results
    from lab.base import naming
    from lab.results.schema import SettingsMapResult
    from lab.results.settings_map import THEN
    from lab.run import copy_rates
    from lab.run.scenario import build

    def device_tag(device: str) -> str:
        return naming.device_tag_of(torch.cuda.get_device_name(torch.device(device))) if device.startswith("cuda") \
            else "cpu"

    progress(f"building {scenario.name} at size `{size}` on {device}"
             + (f", {layers} transformer blocks" if layers else "") + " ...")
    built = build(scenario, size=size, device=device, layers=layers, steps=steps, seed=seed)
    built.pipe.set_progress_bar_config(disable=True)
    weights = sum(t.numel() * t.element_size() for c in built.pipe.components.values()
                  if isinstance(c, torch.nn.Module) for t in (*c.parameters(), *c.buffers()))
    rates = copy_rates.rates(device)
    name = naming.settings_map_name(scenario.name, naming.size_tag(size, layers, steps=steps), device_tag(device))
    going = going_on(scenario.name, prior, texts, progress, host_trace=host_trace, rates=rates)
    if prior is not None:
        command = f"{prior.command}{THEN}{command}"

    def result(new: list[dict], interrupted: bool) -> SettingsMapResult:
        points = going.merged(new)
        none = next((p for p in points if p["setting"] == "none" and p["arm"] == "upstream" and p.get("call_ms")),
                    None)
        return msgspec.convert({
            "name": name,
            "created": results.now(), "command": command, "scenario": scenario.name, "size": size, "layers": layers,
            "steps": steps, "environment": results.environment(device, rates), "params": built.params,
            "weights_gb": weights / 1e9, "compute_ms": none["call_ms"] if none else None,
            "first_calls_ms": first_calls, "points": points,
            "interrupted": interrupted}, SettingsMapResult)

    def keep(setting: str, arm: str) -> Path:
        return trace_dir / f"{name}__{setting}__{arm}.json.gz"

    first_calls = list(prior.first_calls_ms) if prior is not None else []
    if going.again or going.todo:
        progress("a first call with nothing on, timed for no point (what a process's first call pays) ...")
        try:
            first_calls.append(_call(built, seed))
            progress(f"  {first_calls[-1]:,.1f} ms")
        except KeyboardInterrupt:
            progress("interrupted before the first point: keeping the map as it was")
            return result([], True)
        except Exception as e:  # noqa: BLE001 (out of memory without a setting: the points still run, each in its own)
            progress(f"  failed ({type(e).__name__}): the first point carries the process's first call")
        finally:
            gc.collect()
            if built.device.startswith("cuda"):
                torch.cuda.empty_cache()
    points, interrupted = measure(built, scenario.name, going.again + going.todo, calls=calls, seed=seed,
                                  slow_s=slow_s, rates=rates, progress=progress,
                                  compute_ms=computed(prior) if prior is not None else None,
                                  arms={t: going.arms[t] for t in going.again},
                                  done=(lambda so_far: save(result(so_far, True))) if save is not None else None,
                                  keep=keep if trace_dir is not None else None, ended=going.ended,
                                  host_trace=host_trace)
    return result(points, interrupted)

"""An A/B's paired profiles: profiled calls of both arms, alternating which goes first, each pair analysed as it
comes (`lab.traces.analysis.compare`), and how many of them fit before a time limit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lab.base.errors import raise_if_interrupted
from lab.measure.blocks import DEADLINE_MARGIN_S
from lab.measure.config import ABConfig
from lab.measure.verify import ArmLike
from lab.run.profile import ProfileOptions
from lab.run.scenario import Built
from lab.verdicts import stats


#: how much longer a profiled call (with stacks) takes than a plain one, and the seconds of trace analysis per
#: profiled pair: a plan's allowance, set above what the committed GPU A/Bs took (FINDINGS, "Planning the profiles";
#: at calls under a second the analysis of the traces is most of a pair)
PROFILED_CALL_FACTOR = 2.5
ANALYSIS_S_PER_PAIR = 15.0


def profile_pairs_that_fit(wanted: int, call_s: float, seconds_left: float | None, block_s: float = 0.0) -> int:
    """How many of `wanted` profiled pairs to take when `seconds_left` remain before a time limit (None: no limit)
    and a plain call takes `call_s`: as many as end before it with room for one timing block of `block_s`, at least
    one if one pair ends before it, else none. A run whose profiles alone outlast the limit never reaches a block,
    and none of it would be kept, not even the call time its campaign plans the next run from."""
    wanted = max(1, wanted)
    if seconds_left is None:
        return wanted
    pair_s = 2 * PROFILED_CALL_FACTOR * call_s + ANALYSIS_S_PER_PAIR
    if pair_s <= 0:
        return wanted
    fit = int((seconds_left - DEADLINE_MARGIN_S - block_s) // pair_s)
    if fit < 1:  # one pair if it alone ends before the limit (no block after it), else none
        fit = int(seconds_left - DEADLINE_MARGIN_S >= pair_s)
    return min(wanted, fit)


def paired_profiles(built: Built | None, control: ArmLike, test: ArmLike, trace_dir: Path, stem: str, config: ABConfig,
                    calls: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """`calls` (default `config.profile_calls`) profiled calls per arm (alternating which arm goes first), each pair
    analysed as it comes. The metrics are the medians over the pairs, with each arm's range; the per-site detail
    (sync sites, CPU gaps, function totals' call counts) is the first pair's. A Ctrl-C (or a time limit) after the
    first complete pair keeps the pairs complete by then (`cut_short`: the run then times no block); before it, it
    is raised."""
    from lab.traces.analysis import compare
    from lab.traces.trace import load
    from lab.traces.work import median_summary, summary

    # shapes give the device work's FLOPs, roofline and strided inputs (`lab.traces.work`); with Python stacks on,
    # what they add to a profiled call is small beside what the stacks cost
    options = ProfileOptions(record_shapes=True, with_stack=config.with_stack)
    paths: dict[str, list[Path]] = {"control": [], "test": []}
    pairs = []
    wanted = max(1, calls if calls is not None else config.profile_calls)
    cut_short = False
    try:
        for k in range(wanted):
            raise_if_interrupted()
            done = {}
            for arm in ((control, test) if k % 2 == 0 else (test, control)):
                done[arm.name] = arm.profile(built, trace_dir, f"{stem}_{arm.name}{f'_{k + 1}' if k else ''}", options,
                                             config.seed)
            pairs.append(compare(load(done["control"]), load(done["test"]), functions=("hooks.py:_set_context",)))
            for name, path in done.items():
                paths[name].append(path)
    except KeyboardInterrupt:
        if not pairs:
            raise
        cut_short = True
        if progress is not None:
            progress(f"  interrupted: keeping the {len(pairs)} complete profiled pair(s)")
    compiled = {arm: {k: v for k, v in pairs[0][arm]["compile"].items() if k != "outside_sites"}
                for arm in ("control", "test")}
    for arm in ("control", "test"):  # guard time per call: the median over the pairs, as the other metrics
        per_call = [p[arm]["compile"]["guards"]["per_pipeline_call_us"] for p in pairs if p[arm]["compile"].get("compiled")]
        if per_call:
            compiled[arm]["guards"] = {**compiled[arm]["guards"], "per_pipeline_call_us": stats.median(per_call),
                                       "per_pipeline_call_range_us": [min(per_call), max(per_call)]}
    result = pairs[0]
    regions = {arm: result[arm]["regions"] for arm in ("control", "test")}
    for arm in ("control", "test"):  # function totals: medians over the pairs as well
        for name, fn in regions[arm]["functions"].items():
            totals = [p[arm]["regions"]["functions"].get(name, {}).get("total_us", 0.0) for p in pairs]
            regions[arm]["functions"][name] = {**fn, "total_us": stats.median(totals)}
    return {
        "calls": len(pairs),
        "calls_wanted": config.profile_calls,
        "cut_short": cut_short,
        "traces": {k: str(v[0]) for k, v in paths.items()},
        "all_traces": {k: [str(p) for p in v] for k, v in paths.items()},
        "metrics": stats.median_metrics([p["metrics"] for p in pairs]),
        "sync_sites": result["sync_sites"],
        "regions": regions,
        "cpu_gaps_us": {arm: result[arm]["cpu_gaps"].get("gaps_us") for arm in ("control", "test")},
        "host_read_sites": {arm: result[arm]["host_reads"]["scalar_read_sites"] for arm in ("control", "test")},
        "gpu_gaps": {arm: result[arm]["gpu"].get("gaps", [])[:10] for arm in ("control", "test")},
        "name_count_changes": dict(list(result["name_counts"].items())[:20] + list(result["name_counts"].items())[-20:]),
        "compile": compiled,
        "checklist": {arm: result[arm]["checklist"] for arm in ("control", "test")},
        "gap_functions": result["gap_functions"],
        "work": {arm: median_summary([summary(p[arm]["work"]) for p in pairs]) for arm in ("control", "test")},
        # each profiled call's busiest-stream device time: the floor of the trace's bound (`lab.verdicts.bound`)
        "busy_ms": {arm: [p["metrics"]["gpu_stream_busy_us"][arm] / 1000 for p in pairs
                          if p["metrics"].get("gpu_stream_busy_us", {}).get(arm) is not None]
                    for arm in ("control", "test")},
    }

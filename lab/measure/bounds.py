"""The bound the profiled calls put on an A/B's change (`lab.verdicts.bound`): the unprofiled calls it is read
against, and the bound read from them and the profiles, kept where a run goes on from another."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lab.base.errors import raise_if_interrupted
from lab.measure.config import ABConfig
from lab.measure.verify import ArmLike
from lab.run.scenario import Built

if TYPE_CHECKING:
    from lab.results.schema import ABResult


def bound_calls(built: Built | None, control: ArmLike, test: ArmLike, config: ABConfig) -> dict[str, list[float]]:
    """`BOUND_CALLS` unprofiled calls per arm, in mirrored alternation (C T T C ...) as a block's calls are: the wall
    times the trace's bound is read against (`lab.verdicts.bound`)."""
    from lab.verdicts.bound import BOUND_CALLS

    walls: dict[str, list[float]] = {"control": [], "test": []}
    for r in range(BOUND_CALLS):
        for arm in ((control, test) if r % 2 == 0 else (test, control)):
            raise_if_interrupted()
            walls[arm.name].append(arm.call(built, config.warmup, config.seed).wall_ms)
    return walls


def read_bound(built: Built | None, control: ArmLike, test: ArmLike, config: ABConfig, profile: dict | None,
               prior: ABResult | None, progress: Callable[[str], None]) -> dict | None:
    """The trace's bound on the change, with what it was read from (`result["bound"]`): kept from the run this one
    goes on from, else read from this run's profiles and `bound_calls`; None where `config.bound` is off or no
    profile was taken."""
    import msgspec

    from lab.verdicts.bound import PROFILED_CALLS, trace_bound, unbounded

    if config.bound == "off":
        return None
    if prior is not None and prior.bound is not None:
        progress("the trace's bound: kept from the run this one goes on from")
        return msgspec.to_builtins(prior.bound)
    if not profile or profile.get("cut_short"):
        return None
    busy = profile.get("busy_ms") or {"control": [], "test": []}
    if min(len(busy["control"]), len(busy["test"])) < PROFILED_CALLS:  # a CPU run, or one profiled pair
        found = unbounded(config.margin, "the profiled calls recorded GPU work in fewer than "
                                         f"{PROFILED_CALLS} calls per arm")
        return {**found.to_dict(), "walls_ms": {}, "busy_ms": busy}
    progress("the trace's bound: unprofiled calls of each arm against their profiled GPU work ...")
    walls = bound_calls(built, control, test, config)
    found = trace_bound(walls["control"], walls["test"], busy["control"], busy["test"], config.margin)
    progress(f"  {found.summary()}")
    return {**found.to_dict(), "walls_ms": walls, "busy_ms": busy}


#: timed calls of the pipeline without offloading (after one warm-up call): its compute time is their median
COMPUTE_CALLS = 3
#: the share of the GPU's memory free for the lab that the weights may take when offloading is undone
FITS = 0.8


def compute_without_offloading(built: Built | None, control: ArmLike, config: ABConfig,
                               progress: Callable[[str], None]) -> dict | None:
    """The call's compute time without offloading, on the same build: the offloading settings undone (the weights
    moved to the device, the other settings kept), one warm-up call and `COMPUTE_CALLS` timed calls of the control
    arm, then the settings turned on again as the build turned them on. None where no offloading setting is on or
    the arms run in worker processes; a `reason` where the weights do not fit on the device without offloading."""
    import torch

    from lab.run.settings import GROUP, apply
    from lab.verdicts import stats

    if built is None or not built.device.startswith("cuda") or built.undo_settings is None:
        return None
    chosen = list(built.chosen_settings)
    offloading = [s for s in chosen if GROUP.get(s.name) == "offloading"]
    if not offloading:
        return None
    weights = sum(t.numel() * t.element_size() for c in built.pipe.components.values()
                  if isinstance(c, torch.nn.Module) for t in (*c.parameters(), *c.buffers()))
    free, _ = torch.cuda.mem_get_info(torch.device(built.device))
    room = free + torch.cuda.memory_allocated(torch.device(built.device))
    if weights > FITS * room:
        return {"reason": f"the weights ({weights / 1e9:,.1f} GB) do not fit on the device without offloading "
                          f"({room / 1e9:,.1f} GB for the lab)"}
    progress("the call without offloading (the offload limit's compute) ...")
    built.undo_settings()
    try:
        undo_others = apply([s for s in chosen if s not in offloading], built)
        try:
            control.call(built, 0, config.seed, marks=False)
            walls = [control.call(built, 0, config.seed, marks=False).wall_ms for _ in range(COMPUTE_CALLS)]
        finally:
            undo_others()
    finally:
        built.undo_settings = apply(chosen, built)
    return {"compute_ms": stats.median(walls), "walls_ms": walls}


def offload_limits(outcome: dict, compute: dict | None, rates: dict[str, float] | None) -> dict | None:
    """Each arm's offloaded call against its limits (`lab.verdicts.offload_limit`): its median call time (the
    blocks', else the bound's unprofiled calls'), the bytes its profiled calls copied each way (their median) and the
    compute time without offloading, at the host's pinned copy rates. None without a compute measurement."""
    from lab.verdicts import stats
    from lab.verdicts.offload_limit import offload_limit

    if compute is None:
        return None
    if "reason" in compute:
        return {**compute}
    metrics = (outcome.get("profile") or {}).get("metrics") or {}
    out: dict = {**compute, "rates": rates}
    reasons = []
    for arm in ("control", "test"):
        walls = (outcome.get("samples") or {}).get(arm, {}).get("wall_ms") or \
            ((outcome.get("bound") or {}).get("walls_ms") or {}).get(arm)
        h2d = (metrics.get("copied_HtoD_bytes") or {}).get(arm)
        d2h = (metrics.get("copied_DtoH_bytes") or {}).get(arm)
        if not walls or h2d is None or d2h is None or not rates:
            reasons.append(f"the {arm} arm has no " + ("call time" if not walls else "copy rates" if not rates
                                                        else "profiled copies"))
            continue
        out[arm] = offload_limit(stats.median(walls), compute["compute_ms"], int(h2d), int(d2h), rates).to_dict()
    if reasons:
        out["reason"] = "; ".join(reasons)
    return out

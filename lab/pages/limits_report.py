"""What bounds an A/B's calls, on its page: the trace's bound on the change (`lab.verdicts.bound`), an offloaded
call against the limits its copies and compute allow (`lab.verdicts.offload_limit`), and the host's copy rates those
limits are read at (`lab.run.copy_rates`)."""

from __future__ import annotations

from lab.results.schema import ABResult


def copy_rates_lines(env) -> list[str]:
    """The host's copy rates, where the result recorded them: an offloading setting's speed rests on them."""
    r = env.copy_rates
    if not r:
        return []
    return [f"Host copy rates (GB/s, `lab/run/copy_rates.py`): host to device {r['h2d_pageable']:.1f} from pageable "
            f"memory, {r['h2d_pinned']:.1f} from pinned; device to host {r['d2h_new_pageable']:.1f} into new pageable "
            f"memory (`.to(\"cpu\")`), {r['d2h_kept_pageable']:.1f} into kept pageable memory, "
            f"{r['d2h_pinned']:.1f} into pinned.", ""]


def bound_lines(result: ABResult) -> list[str]:
    """What the trace's bound said (`lab.verdicts.bound`): the interval of ratios the arms' GPU work allows, and
    what it was read from; where it decided without blocks, that is the verdict's whole ground."""
    b = result.bound
    if b is None:
        return []
    if b.reason:
        return [f"The trace's bound: none ({b.reason}).", ""]
    how = (f"the busiest GPU stream's time in {b.profiled} profiled calls per arm (the least, less their spread: "
           f"{b.control_busy_ms:,.1f} ms control, {b.test_busy_ms:,.1f} ms test) against the slowest of {b.calls} "
           f"unprofiled calls per arm ({b.control_wall_ms:,.1f} ms control, {b.test_wall_ms:,.1f} ms test)")
    said = (f"decides equivalence within ±{b.margin * 100:g}% without a timing block" if b.decided else
            f"is wider than ±{b.margin * 100:g}%, so the blocks decide"
            + (", their equivalence interval cut by it" if result.stats is not None else ""))
    return [f"The trace's bound: test/control lies in [{b.lo:.4f}, {b.hi:.4f}] (at most {(1 - b.lo) * 100:.2f}% "
            f"faster, {(b.hi - 1) * 100:.2f}% slower), from {how}: a call ends no earlier than its GPU's work. It "
            f"{said}.", ""]


def offload_lines(result: ABResult) -> list[str]:
    """Each arm's offloaded call against the limits its copies and compute allow (`lab.verdicts.offload_limit`)."""
    o = result.offload
    if o is None:
        return []
    if o.compute_ms is None:
        return [f"The offload limit: not read ({o.reason}).", ""]
    lines = [f"The offload limit: the same call without offloading computes in {o.compute_ms:,.1f} ms (median of "
             f"{len(o.walls_ms)} calls); the copies at the host's pinned rates ({o.rates.get('h2d_pinned', 0):g} GB/s "
             f"to the device, {o.rates.get('d2h_pinned', 0):g} GB/s back)." if o.rates else
             f"The offload limit: the call without offloading computes in {o.compute_ms:,.1f} ms.", "",
             "| arm | call | overlap limit | call / overlap limit | serial limit | to the device | back to the host |",
             "|---|---|---|---|---|---|---|"]
    for arm in ("control", "test"):
        a = getattr(o, arm)
        if a:
            lines.append(f"| {arm} | {a['call_ms']:,.1f} ms | {a['overlap_ms']:,.1f} ms | **{a['multiple']:.2f}x** | "
                         f"{a['serial_ms']:,.1f} ms | {a['h2d_bytes'] / 1e9:,.2f} GB ({a['h2d_ms']:,.1f} ms) | "
                         f"{a['d2h_bytes'] / 1e9:,.2f} GB ({a['d2h_ms']:,.1f} ms) |")
    if o.reason:
        lines.append(f"\n{o.reason}.")
    return lines + [""]

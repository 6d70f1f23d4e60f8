"""Shared by the UniPC fixes: the two update functions they rewrite (a module starting with `_` is not a fix)."""

from lab.apply import Rewrite

MODULE = "diffusers.schedulers.scheduling_unipc_multistep"
UPDATES = ("UniPCMultistepScheduler.multistep_uni_p_bh_update", "UniPCMultistepScheduler.multistep_uni_c_bh_update")


def unipc_rewrite(codemod, upstream_since: str | None = None) -> Rewrite:
    """A rewrite of both UniPC update functions; only Wan's checkpoint uses UniPC among the scenarios."""
    return Rewrite(module=MODULE, targets=UPDATES, codemod=codemod, upstream_since=upstream_since, pipelines=("wan", "wan_v2v", "wan22"))

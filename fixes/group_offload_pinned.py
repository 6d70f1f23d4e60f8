"""Group offloading without a stream: keep the host tensors pinned, and onload from them without a host wait.

With `group_offload_keep_host` nothing is copied back after a forward, and what an offloaded call still pays without
a stream is the onload: one blocking copy per tensor from pageable memory before each group's forward, at the
pageable rate (a fraction of the link's: the host copies into a staging buffer first, and waits). The stream path
pins its host copies when offloading is enabled (unless `low_cpu_mem_usage`); without a stream nothing is pinned.

This fix is `group_offload_keep_host` with the kept host tensors pinned as the stream path pins them: the rewritten
`_init_cpu_param_dict` keeps, without a stream, a pinned copy of each parameter's host tensor (a pageable one, as
`group_offload_keep_host` does, with `low_cpu_mem_usage` or a host onload device), the group's first offload (at
its hook's registration) points the parameters at them, and `_transfer_tensor_to_device` copies from a pinned
tensor without blocking. Without a stream the copies stay on the compute stream, in its order, so they still do not
overlap the compute (that is what a stream is for): the host queues the forward's kernels behind them instead of
waiting for each. Outputs are bit-identical: the same values, copied another way. The cost is memory that cannot be
swapped: the whole model page-locked on the host for as long as it is offloaded (the stream path's cost), and while
offloading is enabled each group's host tensors twice until its first offload. With `low_cpu_mem_usage` the block
groups keep pageable tensors; the top-level group, which upstream makes without the user's option, pins its own. It
conflicts with `group_offload_keep_host` (this one includes it). Found by the lab in the settings users run (a
settings map's fixed no-stream call, far from its overlap limit, spent most of its time in pageable copies).

The lab applies settings when it builds, before a fix is switched on, so the groups already exist: the runtime part
gives each group without a stream pinned copies of its host tensors (kept across the fix's turns, `pinned_for`),
points the parameters at them as the group's first offload would, counts the offloads that take the new path and
gives the pageable tensors back on exit; what it keeps is let go once its setting is undone (`release`: the settings
map turns to the next setting, which would otherwise hold another pinned copy of the model). On the CPU,
`tests/test_group_offload_pinned.py` runs it with stand-ins for the pinned memory and the device copies.
"""

import textwrap

import libcst as cst
import libcst.matchers as m

from fixes._offload import (GROUP, GROUP_OFFLOADING, KEEP_TEXT as PAGEABLE, SWAP_TENSORS, KeepHostTensors,
                            counted_offload, forget_the_gone, groups_without_a_stream, kept, pinned_for,
                            plain_parameters, point_at_kept, release_pinned)
from lab.apply import EVERY, Example, Fix, Rewrite, Upstream

EXERCISED = f"{GROUP}.offload_ (parameters pointed back at their kept host tensors, pinned where they can be)"

KEEP = cst.parse_module('''
if _:
    # no side stream: keep a host tensor per parameter, pinned as with a stream unless `low_cpu_mem_usage`
    # (or a host onload device), so that onloads copy without a host wait and offloads point back at them
    pin = not self.low_cpu_mem_usage and torch.device(self.onload_device).type != "cpu"
    for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
        if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
            cpu_param_dict[param] = param.data.cpu().pin_memory() if pin else param.data.cpu()
    return cpu_param_dict
''').body[0].body
# `source_tensor.to(self.onload_device, non_blocking=self.non_blocking)`, the one copy to the device
SELF_NON_BLOCKING = m.Attribute(m.Name("self"), m.Name("non_blocking"))
TO_DEVICE = m.Call(func=m.Attribute(m.Name("source_tensor"), m.Name("to")),
                   args=[m.ZeroOrMore(), m.Arg(SELF_NON_BLOCKING, keyword=m.Name("non_blocking"))])
FROM_PINNED = cst.parse_expression("self.non_blocking or source_tensor.is_pinned()")


class PinnedHostTensors(KeepHostTensors):
    DESCRIPTION = ("group offloading without a stream keeps pinned host tensors, onloads from them without a wait and "
                   "offloads by pointing back at them")
    EDITS_BY_FUNCTION = {**KeepHostTensors.EDITS_BY_FUNCTION, "_transfer_tensor_to_device": frozenset({"no wait"})}
    FUNCTIONS = frozenset(EDITS_BY_FUNCTION)
    EDITS = frozenset().union(*EDITS_BY_FUNCTION.values())
    KEEP_BODY = KEEP.body

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        if node.name.value == "_transfer_tensor_to_device":
            return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("source_tensor"), m.Name("is_pinned")))))
        if node.name.value == "_init_cpu_param_dict":
            return bool(m.findall(node, m.Assign(targets=[m.AssignTarget(m.Name("pin"))])))
        return super().already_fixed(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not (self.inside_target() and m.matches(updated_node, TO_DEVICE)):
            return updated_node
        self.edited("no wait")
        return updated_node.with_changes(args=[
            a.with_changes(value=FROM_PINNED) if a.keyword is not None and a.keyword.value == "non_blocking" else a
            for a in updated_node.args])


def pins(group) -> bool:
    """What the rewritten `_init_cpu_param_dict` pins: the host tensors of a group that onloads to an accelerator,
    unless the user asked for `low_cpu_mem_usage`."""
    import torch

    return not group.low_cpu_mem_usage and torch.device(group.onload_device).type != "cpu"


def runtime(pipe, patcher) -> None:
    """The groups that group offloading made before the fix was switched on, given what the rewritten code keeps and
    pointed at it, as their first offload would have."""
    import torch

    forget_the_gone()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # no copy still reads the pinned space that pinning writes again
    for group in groups_without_a_stream(pipe):
        patcher.setattr(group, "cpu_param_dict", _host_tensors(group))
        point_at_kept(patcher, group)
        patcher.setattr(group, "offload_", counted_offload(group, group.offload_, patcher.counter, EXERCISED))


def _host_tensors(group) -> dict:
    """What the rewritten `_init_cpu_param_dict` keeps for a group without a stream: pinned copies (carved from pinned
    blocks, kept across the fix's turns) where it pins, the host tensors themselves where it does not."""
    params = plain_parameters(group)
    if not pins(group):
        return {p: p.data.cpu() for p in params}
    kept = {}
    for p in params:
        view = pinned_for(p)  # None for a tensor on the device or not contiguous: pinned as upstream pins
        kept[p] = view if view is not None else p.data.cpu().pin_memory()
    return kept


# --- examples (tests/test_fix_examples.py): `group_offload_keep_host`'s edits with the pinning rule in the early
# return, and the copy to the device without a wait from a pinned tensor; the stream paths are left alone

TRANSFER = """
    def _transfer_tensor_to_device(self, tensor, source_tensor, default_stream):
        tensor.data = source_tensor.to(self.onload_device, non_blocking=self.non_blocking)
        if self.record_stream:
            tensor.data.record_stream(default_stream)
"""
ONLOAD = "\n    def _onload_from_memory(self):"
SOURCE = GROUP_OFFLOADING.replace(ONLOAD, TRANSFER + ONLOAD)  # upstream's copy to the device, before the onload
KEEP_TEXT = textwrap.indent("""\
# no side stream: keep a host tensor per parameter, pinned as with a stream unless `low_cpu_mem_usage`
# (or a host onload device), so that onloads copy without a host wait and offloads point back at them
pin = not self.low_cpu_mem_usage and torch.device(self.onload_device).type != "cpu"
for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
    if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
        cpu_param_dict[param] = param.data.cpu().pin_memory() if pin else param.data.cpu()
""", " " * 12)


def pinned(source: str) -> str:
    """An example source as the rewrite leaves it."""
    return kept(source).replace(PAGEABLE, KEEP_TEXT).replace(
        "non_blocking=self.non_blocking)\n        if self.record_stream:",
        "non_blocking=self.non_blocking or source_tensor.is_pinned())\n        if self.record_stream:")


EXAMPLES = (
    Example("the_host_tensors_are_kept_pinned_and_copied_without_a_wait", SOURCE, pinned(SOURCE)),
    Example("already_fixed_is_left_alone", pinned(SOURCE)),
    Example("a_copy_of_another_shape_leaves_the_whole_module_unchanged",
            SOURCE.replace("non_blocking=self.non_blocking)\n        if", "non_blocking=True)\n        if"),
            warning="`_transfer_tensor_to_device` does not have the expected shape (missing edits: no wait; "
                    "unexpected: none); left unchanged."),
)


FIX = Fix(
    name="group_offload_pinned",
    description="Group offloading without a stream keeps the host tensors pinned (unless `low_cpu_mem_usage`), "
                "copies them to the device without a host wait and offloads by pointing the parameters back at them "
                "(no copy back); a weight replaced while offloaded (`.to(dtype)`) is kept in place of the old one.",
    upstream=Upstream(refs=(), note="found by the lab; nothing is pinned without a stream in 0.42.1", overlaps=(
        SWAP_TENSORS,
    )),
    setting="group_offload",
    rewrites=(
        Rewrite(
            module="diffusers.hooks.group_offloading",
            targets=(f"{GROUP}._init_cpu_param_dict", f"{GROUP}._transfer_tensor_to_device",
                     f"{GROUP}._onload_from_memory", f"{GROUP}._offload_to_memory"),
            codemod=PinnedHostTensors,
            pipelines=EVERY,
        ),
    ),
    runtime=runtime,
    runtime_targets=(f"the {GROUP} of each group offloading hook already registered",),
    exercised_by=(EXERCISED,),
    conflicts=("group_offload_keep_host",),
    includes=("group_offload_keep_host",),
    tried_on="flux",
    examples=EXAMPLES,
    release=release_pinned,
)

"""Group offloading without a stream: offload a group's weights by pointing them back at their host tensors.

`enable_group_offload(...)` without `use_stream=True` (its default) onloads each group before its forward with a
blocking copy per tensor, and after the forward offloads it with `module.to(offload_device, non_blocking=False)`:
a second blocking copy per tensor, device to host, of weights that never changed, as many as the onloads, in every
forward of every group; both grow with the depth. The stream path already avoids the copy back: it keeps a host
tensor per parameter (`cpu_param_dict`) and offloads by assignment.

The rewrite does the same without a stream. `_init_cpu_param_dict` keeps each parameter's host tensor itself (no
copy and nothing pinned when the model is on the host, as `from_pretrained` leaves it; a copy, as with a stream, when
it is on the device), and `_offload_to_memory` first points the parameters back at those tensors, so the `.to` that
follows finds them on the host and copies nothing. Buffers are copied back as before (a forward may write to one),
and so are tensor subclasses (quantized weights), which assignment does not restore. Outputs are bit-identical:
the same values, never copied back. The cost: host memory keeps every weight at all times, where upstream frees the
host tensors of the groups on the device (a block group and the top-level group at a time). Found by the lab in the
settings users run; still in 0.42.1.

A kept tensor must follow a weight replaced while its group is offloaded (`model.to(torch.bfloat16)` after
`enable_group_offload(...)`), or the next onload brings the float32 weights back: `_onload_from_memory` keeps the
replacement (`FOLLOW`, `fixes/_offload.py`). Upstream's stream path has the same fault with its pinned copies, and the
same lines mend it: one rule for every kept host tensor, which `group_offload_top_level` inserts too (the two
compose: it is inserted once).

The lab applies settings when it builds, before a fix is switched on, so the groups already exist: the runtime part
gives each group without a stream the host tensors the rewritten `_init_cpu_param_dict` would keep, counts the
offloads that take the new path (the proof that it ran) and takes it all back on exit. With a stream and
`group_offload_top_level`, the top-level group takes that fix's pinned copies instead; the two rewrites compose.
The rewrite (`KeepHostTensors`) is in `fixes/_offload.py`: `group_offload_pinned` makes it with pinned tensors. On
the CPU, `tests/test_group_offload_keep_host.py` runs it with a stand-in for the device copies.
"""

from fixes._offload import (GROUP, GROUP_OFFLOADING, SWAP_TENSORS, KeepHostTensors, counted_offload,
                            groups_without_a_stream, kept, plain_parameters)
from lab.apply import EVERY, Example, Fix, Rewrite, Upstream

EXERCISED = f"{GROUP}.offload_ (parameters pointed back at their host tensors)"


def runtime(pipe, patcher) -> None:
    """The groups that group offloading made before the fix was switched on, given what the rewritten code keeps (its
    host tensors themselves: computed here rather than called, since with `group_offload_top_level` also on the
    rewritten method reads an option that fix gives the groups later)."""
    for group in groups_without_a_stream(pipe):
        patcher.setattr(group, "cpu_param_dict", {p: p.data.cpu() for p in plain_parameters(group)})
        patcher.setattr(group, "offload_", counted_offload(group, group.offload_, patcher.counter, EXERCISED))


# --- examples (tests/test_fix_examples.py): the early return without a stream keeps the host tensors, the onload keeps
# a cast's replacement, the offload without a stream points back at them before its copy; the stream paths,
# `__init__`, the hook and the groups' construction are left alone

EXAMPLES = (
    Example("the_host_tensors_are_kept_and_pointed_back_at", GROUP_OFFLOADING, kept(GROUP_OFFLOADING)),
    Example("already_fixed_is_left_alone", kept(GROUP_OFFLOADING)),
    Example("an_offload_without_an_else_leaves_the_whole_module_unchanged",
            GROUP_OFFLOADING.replace(
                "        else:\n            param.data = param.data.to(self.offload_device, non_blocking=False)\n", ""),
            warning="`_offload_to_memory` does not have the expected shape (missing edits: point back; unexpected: "
                    "none); left unchanged."),
)


FIX = Fix(
    name="group_offload_keep_host",
    description="Group offloading without a stream offloads each group by pointing its parameters back at their host "
                "tensors, instead of a blocking device-to-host copy of every weight after every forward; a weight "
                "replaced while offloaded (`.to(dtype)`) is kept in place of the old one, with a stream too.",
    upstream=Upstream(refs=(), note="found by the lab; the copy back is still in 0.42.1", overlaps=(
        SWAP_TENSORS,
    )),
    setting="group_offload",
    rewrites=(
        Rewrite(
            module="diffusers.hooks.group_offloading",
            targets=(f"{GROUP}._init_cpu_param_dict", f"{GROUP}._onload_from_memory", f"{GROUP}._offload_to_memory"),
            codemod=KeepHostTensors,
            pipelines=EVERY,
        ),
    ),
    runtime=runtime,
    runtime_targets=(f"the {GROUP} of each group offloading hook already registered",),
    exercised_by=(EXERCISED,),
    tried_on="flux",
    examples=EXAMPLES,
)

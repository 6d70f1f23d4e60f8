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
On the CPU, `tests/test_group_offload_keep_host.py` runs it with a stand-in for the device copies.
"""

import textwrap

import libcst as cst
import libcst.matchers as m

from fixes._offload import FOLLOWS, GROUP, GROUP_OFFLOADING, followed, following
from lab.apply import EVERY, Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream, offloading_groups

EXERCISED = f"{GROUP}.offload_ (parameters pointed back at their host tensors)"

# `return cpu_param_dict`, the whole body of the `if` that returns early without a stream
EARLY_RETURN = m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Return(m.Name("cpu_param_dict"))])])
KEEP = cst.parse_module('''
if _:
    # no side stream: keep the parameters' host tensors themselves (no copy while the model is on the host,
    # nothing pinned), so that offloading points the parameters back at them instead of copying them back
    for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
        if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
            cpu_param_dict[param] = param.data.cpu()
    return cpu_param_dict
''').body[0].body
# `cpu_param_dict[param] = param.data.cpu()`, which only the rewrite writes (upstream pins, or calls `_to_cpu`)
KEPT = m.Assign(targets=[m.AssignTarget(m.Subscript(value=m.Name("cpu_param_dict")))],
                value=m.Call(func=m.Attribute(value=m.Attribute(m.Name("param"), m.Name("data")), attr=m.Name("cpu")),
                             args=[]))
POINT_BACK = cst.parse_module('''
for param, kept in self.cpu_param_dict.items():  # kept host tensors: the `.to` below copies nothing back
    param.data = kept
''').body[0]


class KeepHostTensors(FunctionRewrite):
    DESCRIPTION = "group offloading without a stream offloads by pointing the parameters back at their host tensors"
    EDITS_BY_FUNCTION = {"_init_cpu_param_dict": frozenset({"keep"}), "_onload_from_memory": frozenset({"follow"}),
                         "_offload_to_memory": frozenset({"point back"})}
    FUNCTIONS = frozenset(EDITS_BY_FUNCTION)
    EDITS = frozenset().union(*EDITS_BY_FUNCTION.values())
    #: the body that replaces the early return without a stream (`group_offload_pinned` keeps pinned tensors)
    KEEP_BODY = KEEP.body

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == GROUP

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        return self.EDITS_BY_FUNCTION[node.name.value]

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.For(target=m.Tuple([m.Element(m.Name("param")), m.Element(m.Name("kept"))])))
                    or m.findall(node, KEPT) or m.findall(node, FOLLOWS))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = original_node.name.value
        if self.inside_target() and name == "_onload_from_memory":
            with_follow = following(updated_node)  # once: as it is where `group_offload_top_level` put it
            if with_follow is not None:
                self.edited("follow")
                updated_node = with_follow
        elif self.inside_target() and name in self.FUNCTIONS:
            updated_node = updated_node.with_changes(body=updated_node.body.with_changes(
                body=[self._edit(name, s) for s in updated_node.body.body]))
        return super().leave_FunctionDef(original_node, updated_node)

    def _edit(self, function: str, statement: cst.BaseStatement) -> cst.BaseStatement:
        """The function's own `if` (not one nested in it), matched by its bodies rather than its test, which
        `group_offload_top_level` rewrites: the two compose."""
        if not isinstance(statement, cst.If):
            return statement
        if function == "_init_cpu_param_dict" and m.matches(statement.body, EARLY_RETURN):
            self.edited("keep")
            return statement.with_changes(body=statement.body.with_changes(body=self.KEEP_BODY))
        if function == "_offload_to_memory" and isinstance(statement.orelse, cst.Else):
            block = statement.orelse.body
            self.edited("point back")
            return statement.with_changes(orelse=statement.orelse.with_changes(
                body=block.with_changes(body=[POINT_BACK, *block.body])))
        return statement


def runtime(pipe, patcher) -> None:
    """The groups that group offloading made before the fix was switched on, given what the rewritten code keeps."""
    for _, group in offloading_groups(pipe):
        if group.stream is not None or group.offload_to_disk_path is not None or getattr(group, "pinned_copies", False):
            continue  # a stream's own copies, the disk, or `group_offload_top_level`'s pinned copies
        patcher.setattr(group, "cpu_param_dict", _host_tensors(group))
        patcher.setattr(group, "offload_", _counted(group, group.offload_, patcher.counter))


def _host_tensors(group) -> dict:
    """What the rewritten `_init_cpu_param_dict` keeps for a group without a stream (computed here rather than called:
    with `group_offload_top_level` also on, the rewritten method reads an option that fix gives the groups later)."""
    import torch

    params = [p for module in group.modules for p in module.parameters()] + list(group.parameters)
    return {p: p.data.cpu() for p in params if type(p.data) is torch.Tensor}


def _counted(group, offload, counter, label: str = EXERCISED):
    """`group.offload_`, counting the calls that point parameters back as `label` (none once another fix pinned the
    group)."""
    def offload_():
        if counter is not None and group.cpu_param_dict and not getattr(group, "pinned_copies", False):
            counter.counts[label] += 1
        return offload()

    return offload_


# --- examples (tests/test_fix_examples.py): the early return without a stream keeps the host tensors, the onload keeps
# a cast's replacement, the offload without a stream points back at them before its copy; the stream paths,
# `__init__`, the hook and the groups' construction are left alone

KEEP_TEXT = textwrap.indent("""\
# no side stream: keep the parameters' host tensors themselves (no copy while the model is on the host,
# nothing pinned), so that offloading points the parameters back at them instead of copying them back
for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
    if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
        cpu_param_dict[param] = param.data.cpu()
""", " " * 12)
POINT_BACK_TEXT = textwrap.indent("""\
for param, kept in self.cpu_param_dict.items():  # kept host tensors: the `.to` below copies nothing back
    param.data = kept
""", " " * 12)


def kept(source: str) -> str:
    """An example source as the rewrite leaves it (upstream's group offloading, or `group_offload_top_level`'s)."""
    early_return = "            return cpu_param_dict\n        return cpu_param_dict\n"
    copy_back = "        else:\n            param.data = param.data.to(self.offload_device, non_blocking=False)\n"
    return followed(source.replace(early_return, KEEP_TEXT + early_return).replace(
        copy_back, copy_back.replace("        else:\n", "        else:\n" + POINT_BACK_TEXT)))


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
        Overlap("#13751", "open",
                "`swap_tensors` in group offloading: rewrites both branches of `_offload_to_memory`, the lines this "
                "diff inserts into (a textual conflict); it keeps the copy back without a stream"),
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

"""Group offloading with a stream: the top-level weights copied without a host wait, from pinned host copies.

`apply_group_offloading(..., offload_type="block_level", use_stream=True)` prefetches each block group on a side
stream, but puts the denoiser's own parameters and its other children (the embedders, the output norm and
projection) in an "unmatched" group made with `stream=None, non_blocking=False`: every transformer call copies each
of those tensors to the device with a blocking copy and, after the call, back to the host with another, although
they never change (still so in 0.42.1). Upstream keeps that group off the side stream for a reason the fix keeps: a
group that onloads itself is not awaited by the compute stream, so a copy on the side stream would race with the
first kernels that read it.

The rewrite gives `ModuleGroup` a `pinned_copies` option, which the unmatched group takes when the user asked for a
stream: the group keeps pinned host copies of its tensors (as a group with a stream does), copies them on the
current stream without blocking (ordered before the kernels that read them, with no host wait) and offloads by
pointing its tensors back at those copies instead of copying the device tensors back (the caching allocator reuses
the freed device memory in the compute stream's order). `low_cpu_mem_usage` is passed on, so a user who turned it
on gets copies pinned at each onload instead of kept pinned. The group's own list of tensors leaves out those of its
submodules, which it moves as modules: upstream lists them twice, harmless while the second `.to` of a tensor already
on the device does nothing, but from the pinned copies each would be copied twice. Kept copies must follow a weight
replaced while the group is offloaded (`model.to(torch.bfloat16)` after enabling offloading), or the next onload
brings the float32 weights back: `_onload_from_memory` keeps the replacement (`FOLLOW`, `fixes/_offload.py`), for
every group that keeps copies, which mends upstream's stream groups too (they have the same fault). Outputs are
bit-identical (the same values, copied another way). The cost is the top-level weights kept pinned on the host, as
the block groups' already are. Without a stream the groups move the same tensors as before, each once. Found by the
lab in the settings users run.

The lab applies settings when it builds, before a fix is switched on, so the groups of a pipeline already exist: the
runtime part gives them what the rewritten code would have (`pinned_copies`; for the unmatched group of a stream
configuration its own tensors only, its pinned copies, its tensors pointed at them as the group's first offload
would, and `non_blocking`), counts that group's onloads (the proof that the fixed path ran) and takes it all back on
exit. Its code runs only with an accelerator stream; on the CPU, `tests/test_group_offload_stream.py` runs it with
stand-ins for the stream and for pinning.
"""

import libcst as cst
import libcst.matchers as m

from fixes._offload import GROUP, GROUP_OFFLOADING, followed, following, point_at_kept
from lab.apply import (EVERY, Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream, call_on_own_line,
                       offloading_groups)

BLOCK_LEVEL = "_apply_group_offloading_block_level"
OPTION = "pinned_copies"
EXERCISED = f"{GROUP}.onload_ (the top-level group, from pinned copies)"

SELF_STREAM = m.Attribute(m.Name("self"), m.Name("stream"))
STREAM_IS_NONE = m.Comparison(left=SELF_STREAM, comparisons=[m.ComparisonTarget(m.Is(), m.Name("None"))])
STREAM_IS_SET = m.Comparison(left=SELF_STREAM, comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))])
NOT_RECORD = m.UnaryOperation(m.Not(), m.Attribute(m.Name("self"), m.Name("record_stream")))
PINNED_WITH = m.With(items=[m.WithItem(m.Call(func=m.Attribute(m.Name("self"), m.Name("_pinned_memory_tensors"))))])
LOW_CPU = m.Param(name=m.Name("low_cpu_mem_usage"))
LOW_CPU_SET = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name("low_cpu_mem_usage")))])])
# the unmatched group: `ModuleGroup(..., stream=None, ...)` (the block groups pass `stream=config.stream`)
UNMATCHED = m.Call(func=m.Name(GROUP), args=[m.ZeroOrMore(), m.Arg(m.Name("None"), keyword=m.Name("stream")),
                                             m.ZeroOrMore()])
HAS_STREAM = cst.parse_expression("config.stream is not None")

EDITS_BY_FUNCTION = {
    "__init__": frozenset({"option", "attribute"}),
    "_init_cpu_param_dict": frozenset({"copies"}),
    "_onload_from_memory": frozenset({"onload", "follow"}),
    "_offload_to_memory": frozenset({"offload", "no wait"}),
    BLOCK_LEVEL: frozenset({"unmatched group", "own parameters", "own buffers"}),
}
# `_gather_..._with_no_group_offloading_parent(module, modules_with_group_offloading)`: the top-level tensors to move
# besides those of the unmatched submodules, which the group moves as its modules
GATHER = {f"_gather_{kind}_with_no_group_offloading_parent": f"own {kind}" for kind in ("parameters", "buffers")}
OWN = cst.parse_expression("modules_with_group_offloading | {name for name, _ in unmatched_modules}")


class PinnedTopLevelGroup(FunctionRewrite):
    DESCRIPTION = "group offloading with a stream copies the top-level group from pinned copies without blocking"
    FUNCTIONS = frozenset(EDITS_BY_FUNCTION)
    EDITS = frozenset().union(*EDITS_BY_FUNCTION.values())

    def __init__(self, context) -> None:
        super().__init__(context)
        self._function: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == GROUP  # `__init__` of the hooks, and their methods, are not ours

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._function.append(node.name.value)
        return super().visit_FunctionDef(node)

    def in_function(self, name: str) -> bool:
        return self.inside_target() and self._function[-1] == name

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        return EDITS_BY_FUNCTION[node.name.value]

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Name(OPTION)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._function.pop()
        if original_node.name.value == "__init__" and self.inside_target():
            updated_node = self._with_option(updated_node)
        if original_node.name.value == "_onload_from_memory" and self.inside_target():
            with_follow = following(updated_node)  # once: as it is where `group_offload_keep_host` put it
            if with_follow is not None:
                self.edited("follow")
                updated_node = with_follow
        return super().leave_FunctionDef(original_node, updated_node)

    def _with_option(self, node: cst.FunctionDef) -> cst.FunctionDef:
        """`pinned_copies: bool = False` after `low_cpu_mem_usage`, kept as `self.pinned_copies` before the copies
        are made."""
        params = list(node.params.params)
        at = next((i for i, p in enumerate(params) if m.matches(p, LOW_CPU)), None)
        if at is not None:
            params.insert(at + 1, params[at].with_changes(
                name=cst.Name(OPTION), annotation=cst.Annotation(cst.Name("bool")), default=cst.Name("False")))
            node = node.with_changes(params=node.params.with_changes(params=params))
            self.edited("option")
        body = list(node.body.body)
        at = next((i for i, s in enumerate(body) if m.matches(s, LOW_CPU_SET)), None)
        if at is not None:
            body.insert(at + 1, cst.parse_statement(f"self.{OPTION} = {OPTION}\n"))
            node = node.with_changes(body=node.body.with_changes(body=body))
            self.edited("attribute")
        return node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        test = updated_node.test
        if self.in_function("_init_cpu_param_dict") and m.matches(test, STREAM_IS_NONE):
            self.edited("copies")
            return updated_node.with_changes(test=cst.parse_expression(f"self.stream is None and not self.{OPTION}"))
        if self.in_function("_onload_from_memory") and m.matches(test, STREAM_IS_SET) and \
                m.findall(updated_node.body, PINNED_WITH):
            self.edited("onload")
            return updated_node.with_changes(test=cst.parse_expression(f"self.stream is not None or self.{OPTION}"))
        if self.in_function("_offload_to_memory") and m.matches(test, NOT_RECORD):
            self.edited("no wait")  # a group without a side stream has nothing to wait for
            return updated_node.with_changes(
                test=cst.parse_expression("self.stream is not None and not self.record_stream"))
        if self.in_function("_offload_to_memory") and m.matches(test, STREAM_IS_SET) and updated_node.orelse:
            self.edited("offload")
            return updated_node.with_changes(test=cst.parse_expression(f"self.stream is not None or self.{OPTION}"))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.in_function(BLOCK_LEVEL):
            return updated_node
        name = updated_node.func.value if isinstance(updated_node.func, cst.Name) else None
        if name in GATHER and m.matches(updated_node, m.Call(args=[m.Arg(m.Name("module")),
                                                                  m.Arg(m.Name("modules_with_group_offloading"))])):
            self.edited(GATHER[name])  # else each tensor of an unmatched submodule is listed, and copied, twice
            return call_on_own_line(name, [updated_node.args[0].value, OWN])
        if not m.matches(updated_node, UNMATCHED):
            return updated_node
        args = list(updated_node.args)
        keywords = [a.keyword.value if a.keyword else None for a in args]
        if "non_blocking" not in keywords or "record_stream" not in keywords:
            return updated_node
        args[keywords.index("non_blocking")] = args[keywords.index("non_blocking")].with_changes(value=HAS_STREAM)
        template = args[keywords.index("record_stream")]
        added = [template.with_changes(keyword=cst.Name(OPTION), value=HAS_STREAM)]
        if "low_cpu_mem_usage" not in keywords:
            added.append(template.with_changes(keyword=cst.Name("low_cpu_mem_usage"),
                                               value=cst.parse_expression("config.low_cpu_mem_usage")))
        at = keywords.index("record_stream") + 1
        self.edited("unmatched group")
        return updated_node.with_changes(args=args[:at] + added + args[at:])


def runtime(pipe, patcher) -> None:
    """The groups that group offloading made before the fix was switched on, as the rewritten code makes them."""
    for hook, group in offloading_groups(pipe):
        top_level = (hook.config.stream is not None and group.stream is None and group.offload_to_disk_path is None
                     and bool(group.modules or group.parameters or group.buffers))
        patcher.setattr(group, OPTION, top_level)
        if top_level:
            of_modules = {id(t) for m in group.modules for t in (*m.parameters(), *m.buffers())}
            patcher.setattr(group, "parameters", [p for p in group.parameters if id(p) not in of_modules])
            patcher.setattr(group, "buffers", [b for b in group.buffers if id(b) not in of_modules])
            patcher.setattr(group, "non_blocking", True)
            patcher.setattr(group, "low_cpu_mem_usage", hook.config.low_cpu_mem_usage)
            patcher.setattr(group, "cpu_param_dict", group._init_cpu_param_dict())
            point_at_kept(patcher, group)
            patcher.count(group, "onload_", EXERCISED)


# --- examples (tests/test_fix_examples.py): the group's option, its copies, onload (which keeps a cast's replacement)
# and offload, the unmatched group's own tensors and its call; the block groups' call, the side stream's wait before
# an onload and the hook's `__init__` are left alone

PINNED = followed(
    GROUP_OFFLOADING
    .replace("        low_cpu_mem_usage: bool = False,\n",
             "        low_cpu_mem_usage: bool = False,\n        pinned_copies: bool = False,\n")
    .replace("        self.low_cpu_mem_usage = low_cpu_mem_usage\n",
             "        self.low_cpu_mem_usage = low_cpu_mem_usage\n        self.pinned_copies = pinned_copies\n")
    .replace("        if self.stream is None:\n", "        if self.stream is None and not self.pinned_copies:\n")
    .replace("            if self.stream is not None:\n                with self._pinned",
             "            if self.stream is not None or self.pinned_copies:\n                with self._pinned")
    .replace("        if self.stream is not None:\n            if not self.record_stream:",
             "        if self.stream is not None or self.pinned_copies:\n"
             "            if self.stream is not None and not self.record_stream:")
    .replace("_no_group_offloading_parent(module, modules_with_group_offloading)\n",
             "_no_group_offloading_parent(\n        module, modules_with_group_offloading | {name for name, _ in "
             "unmatched_modules}\n    )\n")
    .replace("        non_blocking=False,\n        stream=None,\n        record_stream=False,\n",
             "        non_blocking=config.stream is not None,\n        stream=None,\n        record_stream=False,\n"
             "        pinned_copies=config.stream is not None,\n        low_cpu_mem_usage=config.low_cpu_mem_usage,\n")
)
EXAMPLES = (
    Example("the_unmatched_group_copies_from_pinned_copies", GROUP_OFFLOADING, PINNED),
    Example("already_fixed_is_left_alone", PINNED),
    # an offload without the stream's wait: the other four functions' edits are not emitted either (all or nothing),
    # so no half-fixed group offloading can run
    Example("another_shape_leaves_the_whole_module_unchanged",
            GROUP_OFFLOADING.replace("            if not self.record_stream:\n"
                                     "                self._torch_accelerator_module.current_stream().synchronize()\n",
                                     ""),
            warning="`_offload_to_memory` does not have the expected shape (missing edits: no wait; unexpected: "
                    "none); left unchanged."),
)


FIX = Fix(
    name="group_offload_top_level",
    description="Group offloading with a stream copies the denoiser's top-level weights from pinned host copies on "
                "the compute stream, without a host wait, instead of blocking copies there and back in every call.",
    upstream=Upstream(refs=(), note="found by the lab; the top-level group is still blocking in 0.42.1", overlaps=(
        Overlap("#13751", "open",
                "rewrites `_offload_to_memory`, where this diff's `pinned_copies` condition sits (a textual conflict)"),
        Overlap("#12747", "open",
                "keeps chosen groups resident on the device (edits the hook's `pre_forward`): another answer to the "
                "same cost"),
    )),
    setting="group_offload:block_level,stream",
    rewrites=(
        Rewrite(
            module="diffusers.hooks.group_offloading",
            targets=(f"{GROUP}.__init__", f"{GROUP}._init_cpu_param_dict", f"{GROUP}._onload_from_memory",
                     f"{GROUP}._offload_to_memory", BLOCK_LEVEL),
            codemod=PinnedTopLevelGroup,
            pipelines=EVERY,
        ),
    ),
    runtime=runtime,
    runtime_targets=(f"the {GROUP} of each group offloading hook already registered",),
    exercised_by=(EXERCISED,),
    tried_on="flux",
    examples=EXAMPLES,
)

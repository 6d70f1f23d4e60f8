"""Pyramid attention broadcast: compare the current timestep with the skip range once per timestep, not in every
attention call.

`PyramidAttentionBroadcastHook.new_forward` asks `lo < current_timestep_callback() < hi` in every hooked attention
module's forward. The callback diffusers documents is `lambda: pipe.current_timestep`, and the pipelines keep the
current timestep as a device tensor, so each comparison is a host-device sync, as many per call as hooked attention
modules times steps (`results/settings/tiny__cpu.md` counts them). The answer is the
same for every hook until the timestep changes, so it is kept, class-wide, for the timestep object it was computed
for: one comparison per denoising step. Found by the lab; still in 0.42.1.

A hook binds its `new_forward` when it is registered, so hooks that the setting registered before the fix was
switched on would keep the old method; the runtime part points each registered hook at the rewritten one, as a
diffusers with the fix would have bound it (and back on exit).
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import (EVERY, Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method,
                       rebind_new_forward, registered_hooks, with_attribute_first, with_method_before)

HOOK = "PyramidAttentionBroadcastHook"
# `self.timestep_skip_range[0] < self.current_timestep_callback() < self.timestep_skip_range[1]`
RANGE_TEST = m.Comparison(left=m.Subscript(value=m.Attribute(m.Name("self"), m.Name("timestep_skip_range"))),
                          comparisons=[m.ComparisonTarget(operator=m.LessThan(), comparator=m.Call(
                              func=m.Attribute(m.Name("self"), m.Name("current_timestep_callback")))),
                              m.ComparisonTarget(operator=m.LessThan())])
ONCE = cst.parse_expression("self._within_timestep_range()")
LAST = cst.parse_statement(
    "_last_timestep_range = None  # (timestep, range, inside): the last comparison, shared by every hook\n")
HELPER = parse_method('''
@torch.compiler.disable
def _within_timestep_range(self) -> bool:
    """Whether the current timestep lies inside `timestep_skip_range`, compared once per timestep for all hooks.

    The pipelines keep the current timestep as a device tensor, so each comparison is a host-device sync, and every
    hooked attention module made it in every forward. The answer is kept, class-wide, for the timestep object it was
    computed for (the pipelines set a new one at every step). Under torch.compile it runs outside the graph, as the
    comparison it replaces did (a data-dependent branch breaks the graph), so the answer is kept there too.
    """
    timestep = self.current_timestep_callback()
    low, high = self.timestep_skip_range
    if not isinstance(timestep, torch.Tensor):
        return low < timestep < high
    last = PyramidAttentionBroadcastHook._last_timestep_range
    if last is not None and last[0] is timestep and last[1] == (low, high):
        return last[2]
    inside = bool((timestep > low) & (timestep < high))  # one read of the device, where `low < t < high` makes two
    PyramidAttentionBroadcastHook._last_timestep_range = (timestep, (low, high), inside)
    return inside
''')


class TimestepRangeOnce(FunctionRewrite):
    DESCRIPTION = "PyramidAttentionBroadcastHook.new_forward compares the timestep with its range once per timestep"
    FUNCTIONS = frozenset({"new_forward"})
    EDITS = frozenset({"range"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == HOOK

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_within_timestep_range")))))

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        if self.inside_target() and m.matches(updated_node, RANGE_TEST):
            self.edited("range")
            return ONCE
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != HOOK or updated_node.deep_equals(original_node):
            return updated_node
        return with_attribute_first(with_method_before(updated_node, HELPER, "new_forward"), LAST)


def runtime(pipe, patcher) -> None:
    from diffusers.hooks.pyramid_attention_broadcast import PyramidAttentionBroadcastHook

    for module, hook in registered_hooks(pipe, PyramidAttentionBroadcastHook):
        rebind_new_forward(patcher, module, hook)  # the rewritten method, now that the rewrite is in place


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

PAB = """
class PyramidAttentionBroadcastHook(ModelHook):
    _is_stateful = True

    def initialize_hook(self, module):
        self.state = PyramidAttentionBroadcastState()
        return module

    def new_forward(self, module, *args, **kwargs):
        is_within_timestep_range = (
            self.timestep_skip_range[0] < self.current_timestep_callback() < self.timestep_skip_range[1]
        )
        return is_within_timestep_range
"""
PAB_FIXED = """
class PyramidAttentionBroadcastHook(ModelHook):
    _is_stateful = True

    _last_timestep_range = None  # (timestep, range, inside): the last comparison, shared by every hook

    def initialize_hook(self, module):
        self.state = PyramidAttentionBroadcastState()
        return module

""" + as_method(HELPER) + """
    def new_forward(self, module, *args, **kwargs):
        is_within_timestep_range = self._within_timestep_range()
        return is_within_timestep_range
"""
EXAMPLES = (
    Example("rewritten", PAB, PAB_FIXED),
    Example("already_fixed_is_left_alone", PAB_FIXED),
    Example("another_comparison_is_left_unchanged_with_a_warning",
            PAB.replace("self.timestep_skip_range[0] < self.current_timestep_callback()",
                        "self.current_timestep_callback() > self.timestep_skip_range[0]"),
            warning="`new_forward` does not have the expected shape (missing edits: range; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="pab_timestep_once",
    description="Pyramid attention broadcast compares the timestep with its skip range once per step, not per attention call.",
    upstream=Upstream(refs=(), note="found by the lab; every hooked attention call still compares in 0.42.1",
                      overlaps=()),
    setting="pyramid_attention_broadcast",
    rewrites=(
        Rewrite(
            module="diffusers.hooks.pyramid_attention_broadcast",
            targets=(f"{HOOK}.new_forward",),
            codemod=TimestepRangeOnce,
            pipelines=EVERY,
        ),
    ),
    runtime=runtime,
    runtime_targets=(f"{HOOK}.fn_ref.forward of each registered hook",),
    exercised_by=(f"{HOOK}._within_timestep_range",),
    examples=EXAMPLES,
    tried_on="flux",
)

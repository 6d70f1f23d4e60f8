"""FasterCache: compare the current timestep with each skip range once per timestep, not in every hooked call.

FasterCache asks `low < current_timestep_callback() < high` in its denoiser hook (the unconditional branch's range),
in every hooked attention module's forward (the attention's range) and, where it approximates the unconditional
branch, in its two frequency-weight callbacks. The callback diffusers documents is `lambda: pipe.current_timestep`,
and the pipelines keep the current timestep as a device tensor, so each chained comparison is one or two
host-device syncs, two per attention layer per step at a true depth: most of the host scalar reads of a call
where FasterCache is on. The answers are the same for every hook until the timestep changes, so the timestep is
copied to the host once per step (one blocking copy, where there were two reads per hooked call) and compared there,
exactly as on the device, each range's answer kept until the next timestep. Outputs are bit-identical. Found by the
lab in the settings users run; still in 0.42.1 (the pattern of `pab_timestep_once`).

A hook binds its `new_forward` when it is registered, and the frequency-weight callbacks are closures made when
FasterCache is turned on, so what the setting registered before the fix was switched on would keep the old code:
the runtime part points each registered hook at the rewritten method and each default callback at the rewritten
closure (the same `config` cell), as a diffusers with the fix would have made them, and back on exit.
"""

import types

import libcst as cst
import libcst.matchers as m

from lab.apply import (EVERY, Example, Fix, FunctionRewrite, Rewrite, Upstream, call_on_own_line, rebind_new_forward,
                       registered_hooks)

MODULE = "diffusers.hooks.faster_cache"
DENOISER, BLOCK = "FasterCacheDenoiserHook", "FasterCacheBlockHook"
APPLY = "apply_faster_cache"
CALLBACKS = ("low_frequency_weight_callback", "high_frequency_weight_callback")
HELPER_NAME = "_within_timestep_range"
HELPER = cst.parse_module('''
_timestep_on_host = {}  # the last timestep, its copy on the host and each range's answer for it: shared by every hook


@torch.compiler.disable
def _within_timestep_range(timestep, timestep_range) -> bool:
    """Whether `timestep` lies strictly inside `timestep_range`, read from the device once per timestep for all hooks
    and ranges.

    The pipelines keep the current timestep as a device tensor, so each comparison was a host-device sync (two for
    `low < t < high`), in every hooked module's forward. The timestep is copied to the host once when it changes (the
    pipelines set a new one at every step) and compared there, exactly as on the device; each range's answer is kept
    until the next timestep. Under torch.compile it runs outside the graph, as the comparison it replaces did (a
    data-dependent branch breaks the graph), so the answers are kept there too.
    """
    if not isinstance(timestep, torch.Tensor) or timestep.numel() != 1:
        return timestep_range[0] < timestep < timestep_range[1]
    if _timestep_on_host.get("timestep") is not timestep:
        _timestep_on_host.clear()
        _timestep_on_host.update(timestep=timestep, on_host=timestep.cpu())
    key = tuple(timestep_range)
    if key not in _timestep_on_host:
        on_host = _timestep_on_host["on_host"]
        _timestep_on_host[key] = ((on_host > key[0]) & (on_host < key[1])).item()
    return _timestep_on_host[key]
''').body
CLOCK = m.Call(func=m.Attribute(value=m.Name("self") | m.Name("config"), attr=m.Name("current_timestep_callback")))
# `X[0] < <clock>() < X[1]`, the same X on both sides
RANGE_TEST = m.Comparison(left=m.Subscript(slice=[m.SubscriptElement(m.Index(m.Integer("0")))]),
                          comparisons=[m.ComparisonTarget(m.LessThan(), CLOCK),
                                       m.ComparisonTarget(m.LessThan(), m.Subscript(
                                           slice=[m.SubscriptElement(m.Index(m.Integer("1")))]))])
EDITS_BY_FUNCTION = {
    (DENOISER, "new_forward"): frozenset({"unconditional_batch_timestep_skip_range"}),
    (BLOCK, "new_forward"): frozenset({"timestep_skip_range"}),
    (None, APPLY): frozenset({"low_frequency_weight_update_timestep_range",
                              "high_frequency_weight_update_timestep_range"}),
}


class TimestepRangesOnce(FunctionRewrite):
    DESCRIPTION = "FasterCache's hooks compare the timestep with each skip range once per timestep"
    FUNCTIONS = frozenset({"new_forward", APPLY})
    EDITS = frozenset().union(*EDITS_BY_FUNCTION.values())

    def __init__(self, context) -> None:
        super().__init__(context)
        self._class: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._class.append(node.name.value)
        return node.name.value in (DENOISER, BLOCK)  # `new_forward` of other hooks is not ours

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._class.pop()
        return updated_node

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        owner = self._class[-1] if self._class else None
        return EDITS_BY_FUNCTION.get((owner, node.name.value), frozenset())

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Name(HELPER_NAME))))

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        if not (self.inside_target() and m.matches(updated_node, RANGE_TEST)):
            return updated_node
        low, high = updated_node.left.value, updated_node.comparisons[1].comparator.value
        if not low.deep_equals(high):
            return updated_node
        self.edited(low.attr.value if isinstance(low, cst.Attribute) else "range")
        return call_on_own_line(HELPER_NAME, [updated_node.comparisons[0].comparator, low])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        updated_node = super().leave_Module(original_node, updated_node)
        if updated_node.deep_equals(original_node):
            return updated_node
        body = list(updated_node.body)  # the helper goes just before the first hook that calls it
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef) and s.name.value == DENOISER)
        two = [cst.EmptyLine(), cst.EmptyLine()]
        helper = [s.with_changes(leading_lines=body[at].leading_lines if i == 0 else two)
                  for i, s in enumerate(HELPER)]
        body[at:at + 1] = [*helper, body[at].with_changes(leading_lines=two)]
        return updated_node.with_changes(body=body)


def runtime(pipe, patcher) -> None:
    """The hooks and callbacks FasterCache made before the fix was switched on, pointed at the rewritten code."""
    import importlib
    import inspect

    module = importlib.import_module(MODULE)
    rewritten = {name: code for code in inspect.unwrap(module.apply_faster_cache).__code__.co_consts
                 if isinstance(code, types.CodeType) and (name := code.co_name) in CALLBACKS}
    for hooked, hook in registered_hooks(pipe, (module.FasterCacheDenoiserHook, module.FasterCacheBlockHook)):
        rebind_new_forward(patcher, hooked, hook)  # the rewritten method, now that the rewrite is in place
        for name in CALLBACKS if isinstance(hook, module.FasterCacheDenoiserHook) else ():
            old = getattr(hook, name)
            if getattr(old, "__code__", None) is not None and old.__code__.co_name == name and \
                    old.__module__ == MODULE and name in rewritten:  # FasterCache's default, not the user's
                patcher.setattr(hook, name, types.FunctionType(rewritten[name], module.__dict__, name,
                                                               old.__defaults__, old.__closure__))


# --- examples (tests/test_fix_examples.py): the denoiser hook, the attention hook and both default weight callbacks ask
# the helper; PAB's hook is not FasterCache's

FASTER = """
_SPATIAL = ("^blocks.*attn",)


class FasterCacheDenoiserHook(ModelHook):
    def new_forward(self, module, *args, **kwargs):
        is_within_timestep_range = (
            self.unconditional_batch_timestep_skip_range[0]
            < self.current_timestep_callback()
            < self.unconditional_batch_timestep_skip_range[1]
        )
        return is_within_timestep_range


class FasterCacheBlockHook(ModelHook):
    def new_forward(self, module, *args, **kwargs):
        is_within_timestep_range = (
            self.timestep_skip_range[0] < self.current_timestep_callback() < self.timestep_skip_range[1]
        )
        return is_within_timestep_range


class PyramidAttentionBroadcastHook(ModelHook):
    def new_forward(self, module, *args, **kwargs):
        return self.timestep_skip_range[0] < self.current_timestep_callback() < self.timestep_skip_range[1]


def apply_faster_cache(module, config):
    if config.low_frequency_weight_callback is None:

        def low_frequency_weight_callback(module: torch.nn.Module) -> float:
            is_within_range = (
                config.low_frequency_weight_update_timestep_range[0]
                < config.current_timestep_callback()
                < config.low_frequency_weight_update_timestep_range[1]
            )
            return config.alpha_low_frequency if is_within_range else 1.0

    if config.high_frequency_weight_callback is None:

        def high_frequency_weight_callback(module: torch.nn.Module) -> float:
            is_within_range = (
                config.high_frequency_weight_update_timestep_range[0]
                < config.current_timestep_callback()
                < config.high_frequency_weight_update_timestep_range[1]
            )
            return config.alpha_high_frequency if is_within_range else 1.0
"""
FASTER_FIXED = FASTER.replace(
    "\n\nclass FasterCacheDenoiserHook",
    "\n\n" + cst.Module(body=HELPER).code.strip("\n").replace("\n\n\n\n", "\n\n\n")
    + "\n\n\nclass FasterCacheDenoiserHook", 1,
).replace(
    "(\n            self.unconditional_batch_timestep_skip_range[0]\n            < self.current_timestep_callback()\n"
    "            < self.unconditional_batch_timestep_skip_range[1]\n        )",
    "_within_timestep_range(\n            self.current_timestep_callback(), "
    "self.unconditional_batch_timestep_skip_range\n        )",
).replace(
    "(\n            self.timestep_skip_range[0] < self.current_timestep_callback() < self.timestep_skip_range[1]\n"
    "        )\n        return is_within_timestep_range\n\n\nclass PyramidAttentionBroadcastHook",
    "_within_timestep_range(\n            self.current_timestep_callback(), self.timestep_skip_range\n"
    "        )\n        return is_within_timestep_range\n\n\nclass PyramidAttentionBroadcastHook",
)
for _which in ("low", "high"):
    FASTER_FIXED = FASTER_FIXED.replace(
        f"(\n                config.{_which}_frequency_weight_update_timestep_range[0]\n"
        "                < config.current_timestep_callback()\n"
        f"                < config.{_which}_frequency_weight_update_timestep_range[1]\n            )",
        f"_within_timestep_range(\n                config.current_timestep_callback(), "
        f"config.{_which}_frequency_weight_update_timestep_range\n            )")
EXAMPLES = (
    Example("every_range_test_asks_the_helper", FASTER, FASTER_FIXED),
    Example("already_fixed_is_left_alone", FASTER_FIXED),
    Example("a_callback_of_another_shape_leaves_the_whole_module_unchanged",
            FASTER.replace("config.low_frequency_weight_update_timestep_range[0]\n",
                           "config.high_frequency_weight_update_timestep_range[0]\n"),
            warning="`apply_faster_cache` does not have the expected shape (missing edits: "
                    "low_frequency_weight_update_timestep_range; unexpected: none); left unchanged."),
)


FIX = Fix(
    name="faster_cache_timestep_once",
    description="FasterCache compares the timestep with each skip range once per step, not in every hooked call.",
    upstream=Upstream(refs=(), note="found by the lab; every hooked call still compares in 0.42.1",
                      overlaps=()),
    setting="faster_cache",
    rewrites=(
        Rewrite(
            module=MODULE,
            targets=(f"{DENOISER}.new_forward", f"{BLOCK}.new_forward", APPLY),
            codemod=TimestepRangesOnce,
            pipelines=EVERY,
        ),
    ),
    runtime=runtime,
    runtime_targets=(f"{DENOISER} / {BLOCK}.fn_ref.forward and the default frequency-weight callbacks of each "
                     "registered hook",),
    exercised_by=(HELPER_NAME,),
    examples=EXAMPLES,
    tried_on="flux",
)

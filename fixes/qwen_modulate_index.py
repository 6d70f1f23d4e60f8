"""QwenImage: cache the `modulate_index` tensor instead of copying a Python list to the device on every forward.

With `zero_cond_t=True` (the Qwen-Image-Edit-2511 setting) the transformer builds `modulate_index` from a Python
list of B x seq ints with `torch.tensor(..., device=...)` on every forward: a blocking host-to-device copy. It
depends only on `img_shapes` and the device, so it is built once per (shapes, device). Under `torch.compile` it is
built inline as before, so compiled graphs keep no Python-side state. Not upstream (PR #13404 was closed).
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import (Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream, as_method, parse_method,
                       with_method_before)

# `modulate_index = torch.tensor([[0] * prod(...) + [1] * sum(...) for sample in img_shapes], device=..., dtype=...)`
BUILD = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("modulate_index"))],
            value=m.Call(func=m.Attribute(m.Name("torch"), m.Name("tensor")), args=[m.Arg(m.ListComp()), m.ZeroOrMore()]),
        )
    ]
)
LOOKUP = cst.parse_statement("modulate_index = self._modulate_index_for(img_shapes, timestep.device)")
HELPER = parse_method('''
def _modulate_index_for(self, img_shapes, device: torch.device) -> torch.Tensor:
    """`modulate_index` for `img_shapes`, built once per (shapes, device) instead of once per forward.

    Building it is a host-to-device copy of a Python list, which blocks the host on every forward.
    """

    def build() -> torch.Tensor:
        return torch.tensor(
            [[0] * prod(sample[0]) + [1] * sum([prod(s) for s in sample[1:]]) for sample in img_shapes],
            device=device,
            dtype=torch.int,
        )

    if torch.compiler.is_compiling():
        return build()
    key = (tuple(tuple(tuple(s) for s in sample) for sample in img_shapes), device)
    cache = self.__dict__.setdefault("_modulate_index_cache", {})
    if key not in cache:
        if len(cache) >= 8:
            cache.clear()
        cache[key] = build()
    return cache[key]
''')


class CacheModulateIndex(FunctionRewrite):
    DESCRIPTION = "QwenImageTransformer2DModel.forward looks modulate_index up in a per-(shapes, device) cache"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"lookup"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "QwenImageTransformer2DModel"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_modulate_index_for")))))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self.inside_target() and m.matches(updated_node, BUILD):
            self.edited("lookup")
            return LOOKUP.with_changes(leading_lines=updated_node.leading_lines)
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != "QwenImageTransformer2DModel" or updated_node.deep_equals(original_node):
            return updated_node
        return with_method_before(updated_node, HELPER, "forward")


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

QWEN = """
class QwenImageTransformer2DModel:
    def __init__(self):
        self.zero_cond_t = zero_cond_t

    def forward(self, hidden_states, img_shapes=None):
        if self.zero_cond_t:
            timestep = torch.cat([timestep, timestep * 0], dim=0)
            modulate_index = torch.tensor(
                [[0] * prod(sample[0]) + [1] * sum([prod(s) for s in sample[1:]]) for sample in img_shapes],
                device=timestep.device,
                dtype=torch.int,
            )
        else:
            modulate_index = None
        return modulate_index
"""
QWEN_FIXED = """
class QwenImageTransformer2DModel:
    def __init__(self):
        self.zero_cond_t = zero_cond_t

""" + as_method(HELPER) + """
    def forward(self, hidden_states, img_shapes=None):
        if self.zero_cond_t:
            timestep = torch.cat([timestep, timestep * 0], dim=0)
            modulate_index = self._modulate_index_for(img_shapes, timestep.device)
        else:
            modulate_index = None
        return modulate_index
"""
EXAMPLES = (
    Example("rewritten", QWEN, QWEN_FIXED),
    Example("no_op_when_fixed", QWEN_FIXED),
    Example("warns_on_another_shape", QWEN.replace("modulate_index = torch.tensor(", "modulate_index = build_index("),
            warning="`forward` does not have the expected shape (missing edits: lookup; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="qwen_modulate_index",
    description="QwenImage transformer caches modulate_index per (img_shapes, device) (zero_cond_t models only).",
    upstream=Upstream(refs=("#13404 (closed)", "#13401"), overlaps=(
        Overlap("#13404", "closed",
                "the same `(img_shapes, device)` cache of `modulate_index`, not merged"),
        Overlap("#13756", "merged",
                "adds `modulate_index` to the context-parallel plan: a cached tensor must stay splittable as it is"),
    )),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_qwenimage",
            targets=("QwenImageTransformer2DModel.forward",),
            codemod=CacheModulateIndex,
            pipelines=("qwenimage", "qwenimage_zero_cond"),
        ),
    ),
    exercised_by=("QwenImageTransformer2DModel._modulate_index_for",),
    examples=EXAMPLES,
    tried_on="qwenimage_zero_cond",  # its code runs only with `zero_cond_t=True`
)

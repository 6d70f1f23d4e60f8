"""QwenImage: copy the rope frequencies to the device once, instead of in every transformer forward.

`QwenEmbedRope` keeps `pos_freqs` as a plain attribute (complex numbers, which `register_buffer` would cut to their
real part), so `from_pretrained` + `.to(device)` leaves it on the host, and every forward slices the text
frequencies out of `self.pos_freqs.to(device)`: a blocking host-to-device copy of the whole 4096-row table, once
per transformer call. The copy is kept per device on the module (under `torch.compile` the call copies as before,
so compiled graphs keep no Python-side state). Upstream since 0.38.0 (#13406, `_get_device_freqs`).
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Fix, FunctionRewrite, Rewrite, Upstream, parse_method, with_method_before

CLASSES = ("QwenEmbedRope", "QwenEmbedLayer3DRope")
# `self.pos_freqs.to(device)`
COPY = m.Call(func=m.Attribute(value=m.Attribute(m.Name("self"), m.Name("pos_freqs")), attr=m.Name("to")),
              args=[m.Arg(m.Name("device"), keyword=None)])
LOOKUP = cst.parse_expression("self._pos_freqs_on(device)")
HELPER = parse_method('''
def _pos_freqs_on(self, device: torch.device) -> torch.Tensor:
    """`pos_freqs` on `device`, copied there once per device instead of once per forward.

    `pos_freqs` is a plain attribute (complex numbers, which a buffer would lose), so the pipeline's `.to(device)`
    leaves it on the host and the copy is a blocking host-to-device transfer.
    """
    if torch.compiler.is_compiling():
        return self.pos_freqs.to(device)
    cache = self.__dict__.setdefault("_pos_freqs_by_device", {})
    key = torch.device(device)
    if key not in cache:
        cache[key] = self.pos_freqs.to(device)
    return cache[key]
''')


class CachePosFreqs(FunctionRewrite):
    DESCRIPTION = "QwenEmbedRope.forward takes pos_freqs from a per-device copy made once"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"lookup"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value in CLASSES

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_pos_freqs_on")))))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(updated_node, COPY):
            self.edited("lookup")
            return LOOKUP
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value not in CLASSES or updated_node.deep_equals(original_node):
            return updated_node
        return with_method_before(updated_node, HELPER, "forward")


FIX = Fix(
    name="qwen_rope_device",
    description="QwenImage rope copies pos_freqs to the device once per device, not in every transformer forward.",
    upstream=Upstream(refs=("#13406", "#13401"), since="0.38.0"),
    pipelines=("qwenimage", "qwenimage_zero_cond", "qwenimage_edit"),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_qwenimage",
            targets=("QwenEmbedRope.forward", "QwenEmbedLayer3DRope.forward"),
            codemod=CachePosFreqs,
            upstream_since="0.38.0",
            pipelines=("qwenimage", "qwenimage_zero_cond", "qwenimage_edit"),
        ),
    ),
    exercised_by=("QwenEmbedRope._pos_freqs_on",),
)

"""QwenImage: copy the rope frequencies to the device once, instead of in every transformer forward.

`QwenEmbedRope` keeps `pos_freqs` as a plain attribute (complex numbers, which `register_buffer` would cut to their
real part), so `from_pretrained` + `.to(device)` leaves it on the host, and every forward slices the text
frequencies out of `self.pos_freqs.to(device)`: a blocking host-to-device copy of the whole 4096-row table, once
per transformer call. The copy is kept per device on the module (under `torch.compile` the call copies as before,
so compiled graphs keep no Python-side state). Upstream since 0.38.0 (#13406, `_get_device_freqs`).
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method, with_method_before

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


# --- examples (tests/test_fix_examples.py): only the per-forward copy in the rope classes changes, since
# `_compute_video_freqs` is cached per shape and device already (`functools.lru_cache`); other classes are left alone

ROPE = """
class QwenEmbedRope(nn.Module):
    def rope_params(self, index, dim, theta=10000):
        return index

    def forward(self, video_fhw, txt_seq_lens=None, device=None, max_txt_seq_len=None):
        max_txt_seq_len_int = int(max_txt_seq_len)
        txt_freqs = self.pos_freqs.to(device)[max_vid_index : max_vid_index + max_txt_seq_len_int, ...]
        return vid_freqs, txt_freqs

    def _compute_video_freqs(self, frame, height, width, idx=0, device=None):
        pos_freqs = self.pos_freqs.to(device) if device is not None else self.pos_freqs
        return pos_freqs


class QwenImageTransformer2DModel:
    def forward(self, hidden_states):
        return self.pos_freqs.to(device)
"""
ROPE_FIXED = """
class QwenEmbedRope(nn.Module):
    def rope_params(self, index, dim, theta=10000):
        return index

""" + as_method(HELPER) + """
    def forward(self, video_fhw, txt_seq_lens=None, device=None, max_txt_seq_len=None):
        max_txt_seq_len_int = int(max_txt_seq_len)
        txt_freqs = self._pos_freqs_on(device)[max_vid_index : max_vid_index + max_txt_seq_len_int, ...]
        return vid_freqs, txt_freqs

    def _compute_video_freqs(self, frame, height, width, idx=0, device=None):
        pos_freqs = self.pos_freqs.to(device) if device is not None else self.pos_freqs
        return pos_freqs


class QwenImageTransformer2DModel:
    def forward(self, hidden_states):
        return self.pos_freqs.to(device)
"""
EXAMPLES = (
    Example("rewritten", ROPE, ROPE_FIXED),
    Example("no_op_when_fixed", ROPE_FIXED),
    Example("warns_on_another_shape",
            ROPE.replace("txt_freqs = self.pos_freqs.to(device)[", "txt_freqs = self.freqs_on(device)["),
            warning="`forward` does not have the expected shape (missing edits: lookup; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="qwen_rope_device",
    description="QwenImage rope copies pos_freqs to the device once per device, not in every transformer forward.",
    upstream=Upstream(refs=("#13406", "#13401")),
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
    examples=EXAMPLES,
)

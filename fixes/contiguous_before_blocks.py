"""Transformers whose activations enter the block loop transposed: made contiguous once, before the first block.

A patch embedding ends in `flatten(2).transpose(1, 2)` (BCHW -> BNC): a view whose last dimension is not contiguous.
Everything after it keeps that layout (an add or a modulation writes its result in its input's layout), so every
block's norms copy their input, its linears reshape it with a copy, and its elementwise kernels run strided, in every
block of every step. One `.contiguous()` after the embedding pays one copy instead. CogVideoX's activations are two
slices of one sequence (text, then video), each strided the same way. Found by `lab hunt` / `lab census`
(`lab.measure.waste`: strided block inputs, made at the embedding's line); upstream made the same change to SD3
(#14186) and Wan (#14236) in 0.40.0, and has an open one for HunyuanDiT (#14203). The values are the same (a copy), so
the outputs are bit-identical unless a kernel picks another algorithm for the new strides.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream, around_statement

CONTIGUOUS = cst.parse_statement("hidden_states = hidden_states.contiguous()\n")
# `hidden_states = hidden_states.contiguous()`, or a slice with `.contiguous()`: already there
ALREADY = m.Call(func=m.Attribute(attr=m.Name("contiguous")))


def made_by(value: m.BaseExpression) -> m.SimpleStatementLine:
    """`hidden_states = <value>`, as its own statement."""
    return m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("hidden_states"))], value=value)])


def embedder(name: str) -> m.SimpleStatementLine:
    return made_by(m.Call(func=m.Attribute(m.Name("self"), m.Name(name))))


class ContiguousAfter(FunctionRewrite):
    """Insert `hidden_states = hidden_states.contiguous()` after the statement that makes the strided activations
    (`ANCHOR`) in `CLASS.forward`."""

    DESCRIPTION = "make the activations contiguous before the block loop"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"contiguous"})
    CLASS = ""
    ANCHOR: m.BaseMatcherNode = m.DoNotCare()

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == self.CLASS

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, ALREADY))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        changed = self.inside_target() and around_statement(updated_node, self.ANCHOR, after=[CONTIGUOUS])
        if not changed:
            return updated_node
        self.edited("contiguous")
        return changed


class SD3(ContiguousAfter):
    CLASS = "SD3Transformer2DModel"
    ANCHOR = embedder("pos_embed")


class Wan(ContiguousAfter):
    CLASS = "WanTransformer3DModel"
    ANCHOR = made_by(m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(m.Name("hidden_states"), m.Name("flatten"))),
                                             attr=m.Name("transpose"))))


class Sana(ContiguousAfter):
    CLASS = "SanaTransformer2DModel"
    ANCHOR = embedder("patch_embed")


class HunyuanVideo(ContiguousAfter):
    CLASS = "HunyuanVideoTransformer3DModel"
    ANCHOR = embedder("x_embedder")


# `x = hidden_states[:, ...text_seq_length...]`: CogVideoX's text and video parts of the embedded sequence
SLICE = m.Subscript(value=m.Name("hidden_states"), slice=[m.SubscriptElement(m.Slice()), m.SubscriptElement(m.Slice())])


class CogVideoXSlices(FunctionRewrite):
    DESCRIPTION = "make CogVideoX's text and video slices contiguous before the block loop"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"text", "video"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "CogVideoXTransformer3DModel"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, ALREADY))

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not self.inside_target() or not m.matches(updated_node.value, SLICE):
            return updated_node
        target = updated_node.targets[0].target
        label = {"encoder_hidden_states": "text", "hidden_states": "video"}.get(getattr(target, "value", ""))
        if label is None:
            return updated_node
        self.edited(label)
        return updated_node.with_changes(value=cst.Call(func=cst.Attribute(updated_node.value, cst.Name("contiguous"))))


def _rewrite(module: str, cls: type[FunctionRewrite], pipelines: tuple[str, ...], since: str | None = None) -> Rewrite:
    name = getattr(cls, "CLASS", "") or "CogVideoXTransformer3DModel"
    return Rewrite(module=f"diffusers.models.transformers.{module}", targets=(f"{name}.forward",), codemod=cls,
                   upstream_since=since, pipelines=pipelines)


REWRITES = (
    _rewrite("transformer_sd3", SD3, ("sd35",), since="0.40.0"),
    _rewrite("transformer_wan", Wan, ("wan", "wan22", "wan_v2v"), since="0.40.0"),
    _rewrite("sana_transformer", Sana, ("sana",)),
    _rewrite("transformer_hunyuan_video", HunyuanVideo, ("hunyuan_video",)),
    _rewrite("cogvideox_transformer_3d", CogVideoXSlices, ("cogvideox",)),
)

# --- examples (tests/test_fix_examples.py): each model's `forward` as it makes the activations, and made contiguous

SD3_SRC = """
class SD3Transformer2DModel:
    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.pos_embed(hidden_states)  # takes care of adding positional embeddings too.
        temb = self.time_text_embed(timestep, pooled_projections)
        for block in self.transformer_blocks:
            hidden_states = block(hidden_states)
        return hidden_states
"""
SD3_FIXED = SD3_SRC.replace("positional embeddings too.\n",
                            "positional embeddings too.\n        hidden_states = hidden_states.contiguous()\n")
WAN = """
class WanTransformer3DModel:
    def forward(self, hidden_states):
        hidden_states = self.patch_embedding(hidden_states)
        hidden_states = hidden_states.flatten(2).transpose(1, 2)

        for block in self.blocks:
            hidden_states = block(hidden_states)
"""
WAN_FIXED = WAN.replace("transpose(1, 2)\n", "transpose(1, 2)\n        hidden_states = hidden_states.contiguous()\n")
SANA = """
class SanaTransformer2DModel:
    def forward(self, hidden_states, encoder_hidden_states, timestep):
        post_patch_height, post_patch_width = height // p, width // p

        hidden_states = self.patch_embed(hidden_states)

        if guidance is not None:
            timestep, embedded_timestep = self.time_embed(timestep, guidance=guidance)
"""
SANA_FIXED = SANA.replace("self.patch_embed(hidden_states)\n",
                          "self.patch_embed(hidden_states)\n        hidden_states = hidden_states.contiguous()\n")
HUNYUAN = """
class HunyuanVideoTransformer3DModel:
    def forward(self, hidden_states):
        hidden_states = self.x_embedder(hidden_states)
        encoder_hidden_states = self.context_embedder(encoder_hidden_states, timestep, encoder_attention_mask)
"""
HUNYUAN_FIXED = HUNYUAN.replace("self.x_embedder(hidden_states)\n",
                                "self.x_embedder(hidden_states)\n        hidden_states = hidden_states.contiguous()\n")
COGVIDEOX = """
class CogVideoXTransformer3DModel:
    def forward(self, hidden_states, encoder_hidden_states):
        text_seq_length = encoder_hidden_states.shape[1]
        encoder_hidden_states = hidden_states[:, :text_seq_length]
        hidden_states = hidden_states[:, text_seq_length:]
        for block in self.transformer_blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states)
"""
COGVIDEOX_FIXED = (COGVIDEOX.replace("[:, :text_seq_length]", "[:, :text_seq_length].contiguous()")
                   .replace("[:, text_seq_length:]", "[:, text_seq_length:].contiguous()"))
NO_EMBEDDING = ("`forward` does not have the expected shape (missing edits: contiguous; unexpected: none); left "
                "unchanged.")
EXAMPLES = (
    Example("sd3_rewritten", SD3_SRC, SD3_FIXED, codemod=SD3),
    Example("sd3_no_op_when_fixed", SD3_FIXED, codemod=SD3),  # upstream's own line (0.40.0) counts as the fix
    Example("sd3_warns_on_another_shape",
            SD3_SRC.replace("self.pos_embed(hidden_states)", "embed(self, hidden_states)"),
            warning=NO_EMBEDDING, codemod=SD3),
    Example("sd3_another_class_is_left_alone",
            SD3_SRC.replace("SD3Transformer2DModel", "PixArtTransformer2DModel"), codemod=SD3),
    Example("wan_rewritten", WAN, WAN_FIXED, codemod=Wan),
    Example("wan_no_op_when_fixed", WAN_FIXED, codemod=Wan),  # upstream's own line (0.40.0)
    Example("wan_warns_without_the_transpose", WAN.replace(".flatten(2).transpose(1, 2)", ".flatten(2)"),
            warning=NO_EMBEDDING, codemod=Wan),
    Example("sana_rewritten", SANA, SANA_FIXED, codemod=Sana),
    Example("sana_no_op_when_fixed", SANA_FIXED, codemod=Sana),
    Example("sana_warns_on_another_embedding", SANA.replace("self.patch_embed(", "self.embed("),
            warning=NO_EMBEDDING, codemod=Sana),
    Example("hunyuan_video_rewritten", HUNYUAN, HUNYUAN_FIXED, codemod=HunyuanVideo),
    Example("hunyuan_video_no_op_when_fixed", HUNYUAN_FIXED, codemod=HunyuanVideo),
    Example("hunyuan_video_warns_on_another_embedding", HUNYUAN.replace("self.x_embedder(", "self.embed("),
            warning=NO_EMBEDDING, codemod=HunyuanVideo),
    Example("cogvideox_rewritten", COGVIDEOX, COGVIDEOX_FIXED, codemod=CogVideoXSlices),
    Example("cogvideox_no_op_when_fixed", COGVIDEOX_FIXED, codemod=CogVideoXSlices),
    Example("cogvideox_warns_when_one_slice_is_missing",
            COGVIDEOX.replace("        encoder_hidden_states = hidden_states[:, :text_seq_length]\n", ""),
            warning="`forward` does not have the expected shape (missing edits: text; unexpected: none); left "
                    "unchanged.", codemod=CogVideoXSlices),
)


FIX = Fix(
    name="contiguous_before_blocks",
    description="The activations made contiguous once before the block loop, where a patch embedding's transpose (or "
                "CogVideoX's slices) would make every block's norms, linears and elementwise kernels copy or stride.",
    upstream=Upstream(refs=("#14186", "#14236", "#14203"),
                      note="SD3 and Wan since 0.40.0; Sana, HunyuanVideo and CogVideoX not upstream (still in 0.42.1)",
                      overlaps=(
        Overlap("#14186", "merged",
                "SD3's `.contiguous()` after the patch embedding (since 0.40.0), the SD3 site of this fix"),
        Overlap("#14236", "merged",
                "Wan's (since 0.40.0), its Wan site"),
        Overlap("#14203", "open",
                "HunyuanDiT and its ControlNet, pipelines this diff does not touch; none found for Sana, HunyuanVideo "
                "or CogVideoX"),
    )),
    rewrites=REWRITES,
    examples=EXAMPLES,
)

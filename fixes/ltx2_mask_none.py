"""LTX-2: no attention mask where the text connector's registers leave nothing to mask.

With learnable registers (the checkpoint's configuration), the text connector fills every padding position of the
prompt with a register and sets its mask to all zeros (additive: every token attended to); the pipeline then passes
the transformer a text mask of all ones, which the transformer turns into an additive bias of zeros. Every attention
of the connector's blocks and every text cross-attention of every transformer block in every step (video and audio)
so runs with a mask that masks nothing, and a masked attention takes another, slower kernel (mask-driven kernel
choice, as upstream's #12955 found for Z-Image). The rewrite passes no mask where the registers make it all zeros: in
the connector's blocks, and from the pipeline to the transformer (decided from the connector's configuration, not by
reading the mask: no sync). Without registers, the masks are passed as before. The same attention over the same
tokens: another kernel rounds differently, so the outputs are numerically equivalent, not bit-identical
(`lab.verdicts.numerics`). Found by `lab census` (`lab.measure.waste`: masks that mask nothing); still in 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream, around_statement

# the connector's blocks: `for block in self.transformer_blocks:`, which pass each block `attention_mask`
BLOCK_LOOP = m.For(iter=m.Attribute(m.Name("self"), m.Name("transformer_blocks")))
BLOCK_MASK = cst.parse_statement(
    "# with registers the mask is all zeros: every token is attended to, so the blocks take none\n"
    "block_mask = None if self.learnable_registers is not None else attention_mask\n")
# the pipeline: `connector_prompt_embeds, connector_audio_prompt_embeds, connector_attention_mask = self.connectors(..)`
CONNECTORS = m.SimpleStatementLine(body=[m.Assign(value=m.Call(func=m.Attribute(m.Name("self"), m.Name("connectors"))))])
MASK_NONE = cst.parse_statement(
    "\nif self.connectors.video_connector.learnable_registers is not None:\n"
    "    # the connector's registers fill every padding position: the text mask masks nothing\n"
    "    connector_attention_mask = None\n")


class ConnectorBlocksWithoutMask(FunctionRewrite):
    DESCRIPTION = "run the LTX-2 connector's blocks without the all-zero mask its registers leave"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"blocks"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "LTX2ConnectorTransformer1d"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Name("block_mask")))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        changed = self.inside_target() and around_statement(updated_node, BLOCK_LOOP, before=[BLOCK_MASK],
                                                            change=lambda loop: loop.visit(_BlockMask()))
        if not changed:
            return updated_node
        self.edited("blocks")
        return changed


class _BlockMask(cst.CSTTransformer):
    """`attention_mask` passed to a block (by keyword or position) -> `block_mask`."""

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if m.matches(updated_node.value, m.Name("attention_mask")):
            return updated_node.with_changes(value=cst.Name("block_mask"))
        return updated_node


# where classifier-free and spatio-temporal guidance run together, the pipeline splits the text mask per branch
# (`connector_attention_mask.chunk(2, dim=0)[1]`): a mask that is None has no branches to split
CHUNK = m.Subscript(value=m.Call(func=m.Attribute(m.Name("connector_attention_mask"), m.Name("chunk"))))


class PipelineMaskNone(FunctionRewrite):
    DESCRIPTION = "pass the LTX-2 transformer no text mask where the connector's registers leave nothing to mask"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"mask"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Attribute(attr=m.Name("learnable_registers"))))

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        """The mask, and each split of it where the pipeline splits it per guidance branch."""
        return self.EDITS | ({"chunk"} if m.findall(node, CHUNK) else frozenset())

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        changed = self.inside_target() and around_statement(updated_node, CONNECTORS, after=[MASK_NONE])
        if not changed:
            return updated_node
        self.edited("mask")
        return changed

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript):
        if not (self.inside_target() and m.matches(updated_node, CHUNK)):
            return updated_node
        self.edited("chunk")
        return cst.IfExp(test=cst.parse_expression("connector_attention_mask is None"), body=cst.Name("None"),
                         orelse=updated_node)


def _pipeline(module: str, cls: str, pipelines: tuple[str, ...]) -> Rewrite:
    return Rewrite(module=f"diffusers.pipelines.ltx2.{module}", targets=(f"{cls}.__call__",), codemod=PipelineMaskNone,
                   pipelines=pipelines)


# --- examples (tests/test_fix_examples.py): the blocks take no mask where registers are used; the connector still
# returns its (all-zero) mask

CONNECTOR = """
class LTX2ConnectorTransformer1d(nn.Module):
    def forward(self, hidden_states, attention_mask=None):
        if self.learnable_registers is not None:
            attention_mask = torch.zeros_like(attention_mask)

        rotary_emb = self.rope(batch_size, seq_len, device=hidden_states.device)

        # 3. Run 1D transformer blocks
        for block in self.transformer_blocks:
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                hidden_states = self._gradient_checkpointing_func(block, hidden_states, attention_mask, rotary_emb)
            else:
                hidden_states = block(hidden_states, attention_mask=attention_mask, rotary_emb=rotary_emb)

        return hidden_states, attention_mask
"""
CONNECTOR_FIXED = """
class LTX2ConnectorTransformer1d(nn.Module):
    def forward(self, hidden_states, attention_mask=None):
        if self.learnable_registers is not None:
            attention_mask = torch.zeros_like(attention_mask)

        rotary_emb = self.rope(batch_size, seq_len, device=hidden_states.device)
        # with registers the mask is all zeros: every token is attended to, so the blocks take none
        block_mask = None if self.learnable_registers is not None else attention_mask

        # 3. Run 1D transformer blocks
        for block in self.transformer_blocks:
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                hidden_states = self._gradient_checkpointing_func(block, hidden_states, block_mask, rotary_emb)
            else:
                hidden_states = block(hidden_states, attention_mask=block_mask, rotary_emb=rotary_emb)

        return hidden_states, attention_mask
"""
PIPELINE = """
class LTX2Pipeline:
    def __call__(self, prompt):
        connector_prompt_embeds, connector_audio_prompt_embeds, connector_attention_mask = self.connectors(
            prompt_embeds, additive_attention_mask, additive_mask=True
        )

        # 4. Prepare latent variables
        latents = self.prepare_latents()
"""
PIPELINE_FIXED = """
class LTX2Pipeline:
    def __call__(self, prompt):
        connector_prompt_embeds, connector_audio_prompt_embeds, connector_attention_mask = self.connectors(
            prompt_embeds, additive_attention_mask, additive_mask=True
        )

        if self.connectors.video_connector.learnable_registers is not None:
            # the connector's registers fill every padding position: the text mask masks nothing
            connector_attention_mask = None

        # 4. Prepare latent variables
        latents = self.prepare_latents()
"""
# the shape of 0.42.1, where spatio-temporal guidance splits the text mask per branch
SPLIT = """
                    if self.do_spatio_temporal_guidance:
                        prompt_attn_mask = connector_attention_mask.chunk(2, dim=0)[1]
"""
SPLIT_FIXED = """
                    if self.do_spatio_temporal_guidance:
                        prompt_attn_mask = None if connector_attention_mask is None else connector_attention_mask.chunk(2, dim=0)[1]
"""
GUIDED = PIPELINE.replace("        latents = self.prepare_latents()\n", "        latents = self.prepare_latents()\n"
                          "        for t in timesteps:\n            if do_classifier_free_guidance:\n"
                          "                with self.transformer.cache_context('cond_uncond'):\n" + SPLIT.lstrip("\n"))
GUIDED_FIXED = PIPELINE_FIXED.replace("        latents = self.prepare_latents()\n",
                                      "        latents = self.prepare_latents()\n        for t in timesteps:\n"
                                      "            if do_classifier_free_guidance:\n"
                                      "                with self.transformer.cache_context('cond_uncond'):\n"
                                      + SPLIT_FIXED.lstrip("\n"))
EXAMPLES = (
    Example("connector_rewritten", CONNECTOR, CONNECTOR_FIXED, codemod=ConnectorBlocksWithoutMask),
    Example("pipeline_split_mask_rewritten", GUIDED, GUIDED_FIXED, codemod=PipelineMaskNone),
    Example("connector_no_op_when_fixed", CONNECTOR_FIXED, codemod=ConnectorBlocksWithoutMask),
    Example("connector_warns_without_the_block_loop", CONNECTOR.replace("self.transformer_blocks", "self.layers"),
            warning="`forward` does not have the expected shape (missing edits: blocks; unexpected: none); left "
                    "unchanged.", codemod=ConnectorBlocksWithoutMask),
    Example("pipeline_rewritten", PIPELINE, PIPELINE_FIXED, codemod=PipelineMaskNone),
    Example("pipeline_no_op_when_fixed", PIPELINE_FIXED, codemod=PipelineMaskNone),
    Example("pipeline_warns_without_the_connectors", PIPELINE.replace("self.connectors(", "encode_text("),
            warning="`__call__` does not have the expected shape (missing edits: mask; unexpected: none); left "
                    "unchanged.", codemod=PipelineMaskNone),
)


FIX = Fix(
    name="ltx2_mask_none",
    description="LTX-2: no attention mask in the text connector's blocks and the transformer's text cross-attention "
                "where the connector's registers leave nothing to mask (a masked attention takes a slower kernel).",
    upstream=Upstream(refs=("#12955",), note="found by lab census; not upstream (still in 0.42.1); #12955 is the "
                                            "same change for Z-Image", overlaps=(
        Overlap("#13781", "open",
                "moves LTX-2's `connectors.py` out of `pipelines/`: the connector hunk of this diff would move with it"),
        Overlap("#12955", "merged",
                "the same change for Z-Image (no mask where every sequence has the same length)"),
    )),
    rewrites=(
        Rewrite(module="diffusers.pipelines.ltx2.connectors", targets=("LTX2ConnectorTransformer1d.forward",),
                codemod=ConnectorBlocksWithoutMask, pipelines=("ltx2", "ltx2_i2v")),
        _pipeline("pipeline_ltx2", "LTX2Pipeline", ("ltx2",)),
        _pipeline("pipeline_ltx2_image2video", "LTX2ImageToVideoPipeline", ("ltx2_i2v",)),
        _pipeline("pipeline_ltx2_condition", "LTX2ConditionPipeline", ()),
    ),
    examples=EXAMPLES,
)

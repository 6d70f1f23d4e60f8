"""Before/after source tests for the rewrites of the GPU-side waste: contiguous_before_blocks, ltx2_mask_none and
lumina2_gqa (each: the code it rewrites, a no-op on the fixed code, and the warning on another shape)."""

from libcst.codemod import CodemodTest

from fixes.contiguous_before_blocks import SD3, CogVideoXSlices, HunyuanVideo, Wan
from fixes.ltx2_mask_none import ConnectorBlocksWithoutMask, PipelineMaskNone
from fixes.lumina2_gqa import GroupedHeads

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


class TestContiguousAfterTheEmbedding(CodemodTest):
    TRANSFORM = SD3

    def test_rewritten(self) -> None:
        self.assertCodemod(SD3_SRC, SD3_FIXED)

    def test_no_op_when_fixed(self) -> None:  # upstream's own line (0.40.0) counts as the fix
        self.assertCodemod(SD3_FIXED, SD3_FIXED)

    def test_warns_on_another_shape(self) -> None:
        before = SD3_SRC.replace("self.pos_embed(hidden_states)", "embed(self, hidden_states)")
        self.assertCodemod(before, before, expected_warnings=[
            "`forward` does not have the expected shape (missing edits: contiguous; unexpected: none); left unchanged."])

    def test_another_class_is_left_alone(self) -> None:
        other = SD3_SRC.replace("SD3Transformer2DModel", "PixArtTransformer2DModel")
        self.assertCodemod(other, other)


WAN = """
class WanTransformer3DModel:
    def forward(self, hidden_states):
        hidden_states = self.patch_embedding(hidden_states)
        hidden_states = hidden_states.flatten(2).transpose(1, 2)

        for block in self.blocks:
            hidden_states = block(hidden_states)
"""


class TestContiguousAfterTheTranspose(CodemodTest):
    TRANSFORM = Wan

    def test_rewritten(self) -> None:
        fixed = WAN.replace("transpose(1, 2)\n", "transpose(1, 2)\n        hidden_states = hidden_states.contiguous()\n")
        self.assertCodemod(WAN, fixed)


HUNYUAN = """
class HunyuanVideoTransformer3DModel:
    def forward(self, hidden_states):
        hidden_states = self.x_embedder(hidden_states)
        encoder_hidden_states = self.context_embedder(encoder_hidden_states, timestep, encoder_attention_mask)
"""


class TestContiguousAfterTheVideoEmbedder(CodemodTest):
    TRANSFORM = HunyuanVideo

    def test_rewritten(self) -> None:
        fixed = HUNYUAN.replace("self.x_embedder(hidden_states)\n",
                                "self.x_embedder(hidden_states)\n        hidden_states = hidden_states.contiguous()\n")
        self.assertCodemod(HUNYUAN, fixed)


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


class TestContiguousSlices(CodemodTest):
    TRANSFORM = CogVideoXSlices

    def test_rewritten(self) -> None:
        self.assertCodemod(COGVIDEOX, COGVIDEOX_FIXED)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(COGVIDEOX_FIXED, COGVIDEOX_FIXED)

    def test_warns_when_one_slice_is_missing(self) -> None:
        before = COGVIDEOX.replace("        encoder_hidden_states = hidden_states[:, :text_seq_length]\n", "")
        self.assertCodemod(before, before, expected_warnings=[
            "`forward` does not have the expected shape (missing edits: text; unexpected: none); left unchanged."])


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
CONNECTOR_FIXED = (CONNECTOR.replace(
    "        rotary_emb = self.rope(batch_size, seq_len, device=hidden_states.device)\n",
    "        rotary_emb = self.rope(batch_size, seq_len, device=hidden_states.device)\n"
    "        # with registers the mask is all zeros: every token is attended to, so the blocks take none\n"
    "        block_mask = None if self.learnable_registers is not None else attention_mask\n")
    .replace("hidden_states, attention_mask, rotary_emb)", "hidden_states, block_mask, rotary_emb)")
    .replace("attention_mask=attention_mask, rotary_emb", "attention_mask=block_mask, rotary_emb"))


class TestConnectorBlocksWithoutMask(CodemodTest):
    """The blocks take no mask where registers are used; the connector still returns its (all-zero) mask."""

    TRANSFORM = ConnectorBlocksWithoutMask

    def test_rewritten(self) -> None:
        self.assertCodemod(CONNECTOR, CONNECTOR_FIXED)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(CONNECTOR_FIXED, CONNECTOR_FIXED)

    def test_warns_without_the_block_loop(self) -> None:
        before = CONNECTOR.replace("self.transformer_blocks", "self.layers")
        self.assertCodemod(before, before, expected_warnings=[
            "`forward` does not have the expected shape (missing edits: blocks; unexpected: none); left unchanged."])


PIPELINE = """
class LTX2Pipeline:
    def __call__(self, prompt):
        connector_prompt_embeds, connector_audio_prompt_embeds, connector_attention_mask = self.connectors(
            prompt_embeds, additive_attention_mask, additive_mask=True
        )

        # 4. Prepare latent variables
        latents = self.prepare_latents()
"""
PIPELINE_FIXED = PIPELINE.replace(
    "        )\n\n",
    "        )\n\n"
    "        if self.connectors.video_connector.learnable_registers is not None:\n"
    "            # the connector's registers fill every padding position: the text mask masks nothing\n"
    "            connector_attention_mask = None\n\n")


class TestPipelineMaskNone(CodemodTest):
    TRANSFORM = PipelineMaskNone

    def test_rewritten(self) -> None:
        self.assertCodemod(PIPELINE, PIPELINE_FIXED)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(PIPELINE_FIXED, PIPELINE_FIXED)

    def test_warns_without_the_connectors(self) -> None:
        before = PIPELINE.replace("self.connectors(", "encode_text(")
        self.assertCodemod(before, before, expected_warnings=[
            "`__call__` does not have the expected shape (missing edits: mask; unexpected: none); left unchanged."])


LUMINA = """
class Lumina2AttnProcessor2_0:
    def __call__(self, attn, hidden_states):
        # perform Grouped-qurey Attention (GQA)
        n_rep = attn.heads // kv_heads
        if n_rep >= 1:
            key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)

        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=softmax_scale
        )
        return hidden_states
"""
LUMINA_FIXED = (LUMINA.replace("""        if n_rep >= 1:
            key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
""", "").replace("scale=softmax_scale\n", "scale=softmax_scale, enable_gqa=n_rep > 1\n"))


class TestGroupedHeads(CodemodTest):
    TRANSFORM = GroupedHeads

    def test_rewritten(self) -> None:
        self.assertCodemod(LUMINA, LUMINA_FIXED)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(LUMINA_FIXED, LUMINA_FIXED)

    def test_warns_when_the_keys_are_not_repeated(self) -> None:
        before = LUMINA.replace("        if n_rep >= 1:\n", "        if expand:\n")
        self.assertCodemod(before, before, expected_warnings=[
            "`__call__` does not have the expected shape (missing edits: no_repeat; unexpected: none); left unchanged."])

"""Chroma1-HD: ChromaPipeline at 1024x1024, guidance_scale 3.0 with a negative prompt (two transformer calls per step).

Chroma is FLUX.1-schnell with the modulation layers pruned into a small "approximator" MLP (8.9 B parameters); T5 is
its only text encoder (no CLIP pooled vector), and unlike Flux it masks the T5 padding: the pipeline needs
`prompt_attention_mask` (and `negative_prompt_attention_mask`) whenever embeddings are given (`check_inputs`).
"""


from lab.run.scenario import Model, Scenario, randn, token_mask
from scenarios.flux import SCENARIO as FLUX

# T5 tokens (EOS included) of the docs example's prompt and negative prompt: estimates (no T5 tokenizer here), from
# about 73 words-and-punctuation pieces in the prompt and 32 in the negative prompt.
PROMPT_TOKENS, NEGATIVE_TOKENS = 74, 33


def _mask(batch, seq, tokens, device, dtype):
    """The mask `_get_t5_prompt_embeds` builds: 1 for the prompt's tokens and the first padding token, then 0, in the
    text encoder's dtype (bf16 as the docs load it)."""
    return token_mask(batch, seq, tokens + 1, device, dtype)


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.joint_attention_dim
    seq = 512 if size != "tiny" else 48
    tokens, negative_tokens = (PROMPT_TOKENS, NEGATIVE_TOKENS) if size != "tiny" else (8, 4)
    # T5-v1.1-XXL last_hidden_state, padded to max_sequence_length 512 (padding="max_length").
    return {
        "prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": _mask(batch, seq, tokens, device, dtype),
        "negative_prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_attention_mask": _mask(batch, seq, negative_tokens, device, dtype),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="chroma",
    pipeline_cls="diffusers.ChromaPipeline",
    checkpoint="lodestones/Chroma1-HD",
    description="ChromaPipeline (Chroma1-HD), 1024x1024, guidance_scale 3.0 + negative prompt (true CFG)",
    call={"height": 1024, "width": 1024, "guidance_scale": 3.0},
    tiny_call={"height": 8, "width": 8},
    models={
        "transformer": Model(
            cls="diffusers.ChromaTransformer2DModel",
            # class defaults are Chroma1-HD: 19 double / 38 single blocks, 24 x 128 heads, joint 4096, approximator
            # 64 channels / 5120 hidden / 5 layers.
            full={},
            tiny={
                "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
                "num_attention_heads": 2, "joint_attention_dim": 32, "axes_dims_rope": [4, 4, 8],
                "approximator_hidden_dim": 32, "approximator_layers": 1, "approximator_num_channels": 16,
            },
            blocks=("num_layers", "num_single_layers"),
        ),
        "vae": FLUX.models["vae"],  # the FLUX VAE
    },
    scheduler=FLUX.scheduler,
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": "ChromaTransformer2DModel defaults (diffusers 0.37.1 transformer_chroma.py L412-426); "
                       "single_file_utils.py maps `chroma` to lodestones/Chroma1-HD's config and "
                       "convert_chroma_transformer_checkpoint_to_diffusers counts the layers from the checkpoint; "
                       "public copies of the Chroma1-HD config agree key for key (InvokeAI's Chroma loader CHROMA_TRANSFORMER_CONFIG; "
                       "a third-party ChromaTransformer2DModel test's CHROMA_HD_SIGNATURE: 19/38, 128 x 24, 4096, (16,56,56), "
                       "approximator 64/5120/5)",
        "vae": "the FLUX VAE (scenarios/flux.py); the Chroma model card: 'put FLUX VAE into ComfyUI/models/vae'",
        "scheduler": "FLUX.1-dev's (scenarios/flux.py): FlowMatchEuler, dynamic shifting, base/max shift 0.5/1.15, "
                     "seq len 256/4096. The Chroma1-HD scheduler_config.json itself could not be read here "
                     "(unverified); ai-toolkit's Chroma scheduler config (runcomfy-com/ai-toolkit-inference "
                     "src/pipelines/chroma.py CHROMA_SCHEDULER_CONFIG) has exactly these values",
        "call": "docs/source/en/api/pipelines/chroma.md (diffusers main 58eb52c) Inference example: Chroma1-HD, "
                "negative_prompt, guidance_scale=3.0, height/width default 128 * 8 = 1024",
        "prompt_embeds": "T5-v1.1-XXL [B, 512, 4096] (padding='max_length', max_sequence_length 512) + negative of "
                         "the same shape; masks [B, 512] in the embeddings' dtype, 1 up to the first padding token "
                         "(pipeline_chroma.py _get_t5_prompt_embeds); token counts 74/33 estimated",
        "tiny": "tests/pipelines/chroma/test_pipeline_chroma.py get_dummy_components (max_sequence_length 48, 8x8)",
    },
)

"""Mochi 1 preview: MochiPipeline at 480x848, 85 frames, guidance 4.5 with the empty negative prompt.

The diffusers docs examples for genmo/mochi-1-preview (`num_frames=85`, height/width the pipeline defaults 480x848,
guidance_scale the default 4.5; the full-precision example spells out 480x848, 85 frames, guidance 4.5,
negative_prompt "" and max_sequence_length 256). Guidance 4.5 > 1 runs classifier-free guidance: the negative
prompt "" and the prompt are encoded separately and batched together with their masks.
"""

import torch

from lab.run.scenario import Model, Scenario, randn, token_mask

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
CONVERTER = f"{DIFFUSERS}/scripts/convert_mochi_to_diffusers.py"
DOCS = f"{DIFFUSERS}/docs/source/en/api/pipelines/mochi.md"
TEST = f"{DIFFUSERS}/tests/pipelines/mochi/test_mochi.py"
PIPELINE = "diffusers 0.37.1 pipelines/mochi/pipeline_mochi.py"

#: T5 tokens of the docs prompt "Close-up of a chameleon's eye, with its scaly skin changing color. Ultra high
#: resolution 4k." with its </s>: about 27 (an estimate: the T5 tokenizer cannot be loaded here)
PROMPT_TOKENS = 27


def _mask(batch, seq, real, device):
    # the tokenizer pads to max_sequence_length on the right; the pipeline turns its mask into bool
    return token_mask(batch, seq, real, device, torch.bool)


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    # T5-v1.1-XXL last_hidden_state padded to max_sequence_length 256, with the tokenizer's attention mask: the
    # transformer's attention keeps only each sample's unmasked text tokens (MochiAttnProcessor2_0), and the
    # caption pooling of its time embedding averages over them. The negative prompt "" is </s> alone: 1 token.
    config = pipe.transformer.config
    seq = config.max_sequence_length  # 256 full, 16 tiny
    return {
        "prompt": None,
        "prompt_embeds": randn((batch, seq, config.text_embed_dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": _mask(batch, seq, min(seq, PROMPT_TOKENS), device),
        "negative_prompt_embeds": randn((batch, seq, config.text_embed_dim), generator, device, dtype, 0.5),
        "negative_prompt_attention_mask": _mask(batch, seq, 1, device),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="mochi",
    pipeline_cls="diffusers.MochiPipeline",
    checkpoint="genmo/mochi-1-preview",
    description="MochiPipeline (mochi-1-preview), 480x848, 85 frames, guidance 4.5 + empty negative prompt",
    call={"height": 480, "width": 848, "num_frames": 85, "guidance_scale": 4.5},
    tiny_call={"height": 16, "width": 16, "num_frames": 7},
    models={
        "transformer": Model(
            cls="diffusers.MochiTransformer3DModel",
            full={},  # the converter builds MochiTransformer3DModel() with its defaults: 48 layers, 24 x 128
            tiny={
                "patch_size": 2, "num_attention_heads": 2, "attention_head_dim": 8, "num_layers": 2,
                "pooled_projection_dim": 16, "in_channels": 12, "out_channels": None, "qk_norm": "rms_norm",
                "text_embed_dim": 32, "time_embed_dim": 4, "activation_fn": "swiglu", "max_sequence_length": 16,
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLMochi",
            full={},  # the converter passes latent_channels=12, out_channels=3: the class defaults
            tiny={
                "latent_channels": 12, "out_channels": 3, "encoder_block_out_channels": [32, 32, 32, 32],
                "decoder_block_out_channels": [32, 32, 32, 32], "layers_per_block": [1, 1, 1, 1, 1],
            },
        ),
    },
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"invert_sigmas": True}),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{CONVERTER} L430: MochiTransformer3DModel() (class defaults, 10B as the docs say)",
        "vae": f"{CONVERTER} L436: AutoencoderKLMochi(latent_channels=12, out_channels=3) (= class defaults)",
        "scheduler": f"{CONVERTER} L452-453: FlowMatchEulerDiscreteScheduler(invert_sigmas=True); the pipeline sets "
                     "its own linear-quadratic sigmas each call; the hub scheduler_config.json itself not seen",
        "call": f"{DOCS} L94/L115 (num_frames=85) and L211-222 (480x848, 85 frames, guidance 4.5, negative_prompt '', "
                f"max_sequence_length 256); {PIPELINE} L193-194 (default 480x848) and __call__ defaults (guidance 4.5)",
        "prompt_embeds": f"{PIPELINE} _get_t5_prompt_embeds L197-251 (padding='max_length' 256, bool mask) and "
                         "encode_prompt L312 (negative ''): T5-XXL [B, 256, 4096] + masks; the prompt's token "
                         "count (27) is an estimate",
        "force_zeros_for_empty_prompt": f"{CONVERTER} L452-458 leaves it at the pipeline default False (the hub "
                                        "model_index.json not seen); it acts only when the pipeline encodes text",
        "tiny": f"{TEST} L63-103 get_dummy_components and get_dummy_inputs L105-123 (16x16, 7 frames, seq 16); "
                "the test's default FlowMatchEulerDiscreteScheduler replaced by the checkpoint's (invert_sigmas)",
    },
)

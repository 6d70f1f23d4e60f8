"""Sana 1600M 1024px: SanaPipeline at 1024x1024, guidance_scale 4.5 with a negative prompt, flow DPM-Solver++.

Linear-attention DiT on the 32x-compressed DC-AE latents (32 x 32 x 32 at 1024px), Gemma-2-2B text. CFG runs as a
batch of 2 (negative first). Resolution binning is on by default: the size is snapped to the transformer's bin
(sample_size 32: the 1024px bins), which keeps 1024x1024 as it is.

The text embeddings of a user's call: `complex_human_instruction` (the default list) is prepended to the prompt only
when the pipeline encodes it; the tokens are padded to len(instruction) + 300 - 2 and then cut to 300 positions
(select_index: position 0 and the last 299), so `prompt_embeds` is [B, 300, 2304] and its mask holds BOS, the
instruction's last token and the prompt's tokens. Passed embeddings skip all of this (encode_prompt L410).
"""


from lab.run.scenario import Model, Scenario, randn, token_mask

# Mask 1s: of the prompt (BOS + the instruction's last token + about 9 Gemma tokens of the harness prompt, after
# select_index) and of the default negative prompt "" (BOS alone). Estimates: no Gemma tokenizer here.
PROMPT_TOKENS, NEGATIVE_TOKENS = 11, 1


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.caption_channels
    seq = 300 if size != "tiny" else 16
    tokens, negative_tokens = (PROMPT_TOKENS, NEGATIVE_TOKENS) if size != "tiny" else (8, 1)
    # Gemma-2-2B last_hidden_state; check_inputs requires the masks and equal shapes with the negative's, and
    # negative_prompt=None: its default "" may not come with negative_prompt_embeds (L522-526).
    return {
        "prompt": None,
        "negative_prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": token_mask(batch, seq, tokens, device),
        "negative_prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_attention_mask": token_mask(batch, seq, negative_tokens, device),
        "max_sequence_length": seq,
    }


DC_AE_BLOCKS = ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3

SCENARIO = Scenario(
    name="sana",
    pipeline_cls="diffusers.SanaPipeline",
    checkpoint="Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    description="SanaPipeline (Sana 1600M 1024px), 1024x1024, guidance_scale 4.5 + negative prompt, flow DPM-Solver++",
    call={"height": 1024, "width": 1024, "guidance_scale": 4.5},
    # Binning snaps any size to the transformer's bins (tiny sample_size 16: the 512px bins), so tiny asks for
    # 512x512; the tiny DC-AE keeps the 32x compression (16 x 16 latents), so tiny takes the full path.
    tiny_call={"height": 512, "width": 512},
    models={
        "transformer": Model(
            cls="diffusers.SanaTransformer2DModel",
            # class defaults are exactly Sana_1600M_1024px (converter SanaMS_1600M_P1_D20 at image_size 1024): 20
            # layers, 70 x 32 self-attention, 20 x 112 cross-attention, caption 2304, 32 latent channels.
            full={},
            tiny={
                "patch_size": 1, "in_channels": 4, "out_channels": 4, "num_layers": 1, "num_attention_heads": 2,
                "attention_head_dim": 4, "num_cross_attention_heads": 2, "cross_attention_head_dim": 4,
                "cross_attention_dim": 8, "caption_channels": 8, "sample_size": 16,
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderDC",
            full={
                "in_channels": 3, "latent_channels": 32, "attention_head_dim": 32,
                "encoder_block_types": DC_AE_BLOCKS, "decoder_block_types": DC_AE_BLOCKS,
                "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
                "decoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
                "encoder_layers_per_block": [2, 2, 2, 3, 3, 3], "decoder_layers_per_block": [3, 3, 3, 3, 3, 3],
                "encoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
                "decoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
                "upsample_block_type": "interpolate", "downsample_block_type": "Conv", "decoder_norm_types": "rms_norm",
                "decoder_act_fns": "silu", "encoder_out_shortcut": True, "decoder_in_shortcut": True,
                "decoder_conv_act_fn": "relu", "scaling_factor": 0.41407,
            },
            tiny={
                "in_channels": 3, "latent_channels": 4, "attention_head_dim": 2,
                "encoder_block_types": DC_AE_BLOCKS, "decoder_block_types": DC_AE_BLOCKS,
                "encoder_block_out_channels": [8] * 6, "decoder_block_out_channels": [8] * 6,
                "encoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
                "decoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
                "encoder_layers_per_block": [1] * 6, "decoder_layers_per_block": [1] * 6,
                "downsample_block_type": "conv", "upsample_block_type": "interpolate", "decoder_norm_types": "rms_norm",
                "decoder_act_fns": "silu", "scaling_factor": 0.41407,
            },
        ),
    },
    scheduler=(
        "diffusers.DPMSolverMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0},
    ),
    prompt_inputs=prompt_inputs,
    tiny_leaves_out={
        "diffusers/pipelines/sana/pipeline_sana.py:869": "the aspect-ratio bins are chosen by the transformer's "
        "sample_size: 32 at full size takes the 1024px table (this line), tiny's 16 the 512px table two lines on; the "
        "tables differ in their numbers only. A tiny transformer of sample_size 32 would bin every tiny call to "
        "1024 x 1024 and decode it on the CPU",
    },
    sources={
        "transformer": "scripts/convert_sana_to_diffusers.py model_kwargs['SanaMS_1600M_P1_D20'] and transformer_kwargs "
                       "(in/out 32, caption 2304, mlp_ratio 2.5, no attention bias, sample_size 1024 // 32, patch 1, "
                       "norm eps 1e-6, interpolation_scale None at 1024, qk_norm None for Sana 1.0) = the 0.37.1 class "
                       "defaults",
        "vae": "DC-AE f32c32 (mit-han-lab/dc-ae-f32c32-sana-1.0): scripts/convert_dcae_to_diffusers.py get_ae_config "
               "('dc-ae-f32c32-sana-1.0'), in the current block names as a pinned hub copy of a Sana AutoencoderDC "
               "config spells them (ResBlock x3 + EfficientViTBlock x3, downsample 'Conv', scaling 0.41407); the "
               "checkpoint's own vae/config.json not seen directly",
        "scheduler": "scripts/convert_sana_to_diffusers.py: flow-dpm_solver default, DPMSolverMultistepScheduler("
                     "flow_shift=3.0 (image_size != 4096), use_flow_sigmas=True, prediction_type='flow_prediction'); "
                     "a pinned hub copy of a Sana scheduler_config.json has these and class defaults otherwise",
        "call": "pipeline_sana.py __call__ defaults: height/width 1024, guidance_scale 4.5 (L736), negative_prompt '', "
                "max_sequence_length 300 (L754), use_resolution_binning True; docstring example pipe(prompt=...) "
                "(checkpoint Sana_1600M_1024px_BF16_diffusers there; the docs page lists this checkpoint in fp16)",
        "prompt_embeds": "pipeline_sana.py _get_gemma_prompt_embeds (L308-332) and encode_prompt select_index (L408-421):"
                         " Gemma-2-2B last_hidden_state [B, 300, 2304] + int64 mask; negative '' without the "
                         "instruction, 300 tokens (L433-440). Mask token counts estimated (11 / 1)",
        "tiny": "tests/pipelines/sana/test_sana.py get_dummy_components (transformer; sample_size 16 instead of 32 and "
                "a 6-stage 8-channel DC-AE instead of the 2-stage one, so binning gives 512px and a 16 x 16 latent)",
    },
)

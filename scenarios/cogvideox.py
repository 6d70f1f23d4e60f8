"""CogVideoX-5b: CogVideoXPipeline at 480x720, 49 frames, guidance 6.0 with a negative prompt, CogVideoX DDIM.

The diffusers docs example for THUDM/CogVideoX-5b (`guidance_scale=6`, 50 steps, height/width/frames left at the
pipeline defaults: the transformer's sample size 60x90 latents x 8 = 480x720, sample_frames 49). The docs do not
pass `use_dynamic_cfg`, so it stays at its default False (the CogVideo repo's own cli_demo turns it on with the DPM
scheduler; a docs user does not). Guidance 6.0 > 1 runs classifier-free guidance with the negative prompt's
embeddings (the pipeline's default negative prompt is "", encoded to the same [B, 226, 4096]).
"""

from lab.run.scenario import Model, Scenario, text_embeds

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
CONVERTER = f"{DIFFUSERS}/scripts/convert_cogvideox_to_diffusers.py"
DOCS = f"{DIFFUSERS}/docs/source/en/api/pipelines/cogvideox.md"
TEST = f"{DIFFUSERS}/tests/pipelines/cogvideo/test_cogvideox.py"
PIPELINE = "diffusers 0.37.1 pipelines/cogvideo/pipeline_cogvideox.py"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    # T5-v1.1-XXL last_hidden_state, padded to max_sequence_length (226, the transformer's max_text_seq_length) with
    # no attention mask: every position is used. The negative prompt's embeddings have the same shape.
    seq = pipe.transformer.config.max_text_seq_length  # 226 full, 16 tiny
    dim = pipe.transformer.config.text_embed_dim
    embeds = text_embeds(batch, seq, dim, generator, device, dtype, negative=True)
    return {"prompt": None, **embeds, "max_sequence_length": seq}


SCENARIO = Scenario(
    name="cogvideox",
    pipeline_cls="diffusers.CogVideoXPipeline",
    checkpoint="THUDM/CogVideoX-5b",
    description="CogVideoXPipeline (CogVideoX-5b), 480x720, 49 frames, guidance 6.0 + negative prompt, "
                "use_dynamic_cfg off, CogVideoX DDIM",
    call={"height": 480, "width": 720, "num_frames": 49, "guidance_scale": 6.0, "use_dynamic_cfg": False},
    tiny_call={"height": 16, "width": 16, "num_frames": 9},
    models={
        "transformer": Model(
            cls="diffusers.CogVideoXTransformer3DModel",
            # the 5B config: 42 layers, 48 heads x 64, RoPE; every other key is the class default (= the converter's
            # version "1.0" init kwargs: patch 2, no temporal patch, patch_bias, 60x90 latents, 49 frames)
            full={"num_layers": 42, "num_attention_heads": 48, "use_rotary_positional_embeddings": True},
            tiny={
                # the upstream test's config, with RoPE on as the 5B model (attention_head_dim 16 instead of 8: the
                # 3D RoPE splits the head into t/h/w parts of head/4, 3*head/8, 3*head/8, which 8 does not fill)
                "num_attention_heads": 4, "attention_head_dim": 16, "in_channels": 4, "out_channels": 4,
                "time_embed_dim": 2, "text_embed_dim": 32, "num_layers": 2, "sample_width": 2, "sample_height": 2,
                "sample_frames": 9, "patch_size": 2, "temporal_compression_ratio": 4, "max_text_seq_length": 16,
                "use_rotary_positional_embeddings": True,
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLCogVideoX",
            full={"scaling_factor": 0.7},  # the 5B VAE scale; all else the class defaults, as the converter builds it
            tiny={
                "in_channels": 3, "out_channels": 3, "down_block_types": ["CogVideoXDownBlock3D"] * 4,
                "up_block_types": ["CogVideoXUpBlock3D"] * 4, "block_out_channels": [8, 8, 8, 8],
                "latent_channels": 4, "layers_per_block": 1, "norm_num_groups": 2, "temporal_compression_ratio": 4,
                "scaling_factor": 0.7,
            },
            # the converter saves the VAE in fp32 ("for better quality"), but the docs load the whole pipeline in one
            # dtype (`from_pretrained(..., dtype=torch.bfloat16)`), which casts it: the scenario dtype here
        ),
    },
    scheduler=(
        "diffusers.CogVideoXDDIMScheduler",
        {"snr_shift_scale": 1.0, "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
         "clip_sample": False, "num_train_timesteps": 1000, "prediction_type": "v_prediction",
         "rescale_betas_zero_snr": True, "set_alpha_to_one": True, "timestep_spacing": "trailing"},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{CONVERTER} L150-157 (num_layers, num_attention_heads, use_rotary_positional_embeddings from "
                       "the command line: L249-256 '5B: 42 layers, 48 heads, RoPE True') and L200-210 (version 1.0 "
                       "init kwargs = class defaults); public copies of the hub config.json agree (48 x 64, 42 "
                       "layers, 226 text tokens, 4096 text dim, 512 time embed)",
        "vae": f"{CONVERTER} L176-182 (AutoencoderKLCogVideoX(scaling_factor=...)) and L257-258 ('5B: 0.7')",
        "scheduler": f"{CONVERTER} L259-260 ('5B: snr_shift_scale 1.0') and L313-326: CogVideoXDDIMScheduler "
                     "(v_prediction, zero-SNR, trailing); the hub scheduler_config.json of CogVideoX-5b itself not "
                     "seen (a public copy of CogVideoX-5b-I2V's names CogVideoXDDIMScheduler with these values)",
        "call": f"{DOCS} L83-87 (guidance_scale=6, 50 steps; CogVideoX-5b loaded at L65-70); {PIPELINE} L614-616 "
                "(height/width/frames default to sample_height/width x 8 and sample_frames: 480x720, 49) and "
                "__call__ defaults (use_dynamic_cfg False, max_sequence_length 226, negative prompt '')",
        "prompt_embeds": f"{PIPELINE} _get_t5_prompt_embeds L202-242 (padding='max_length', no mask): T5-XXL [B, 226, 4096] "
                         "+ negative of the same shape",
        "tiny": f"{TEST} L55-111 get_dummy_components (RoPE on and head dim 16 here, see above; the test's DDIMScheduler "
                "replaced by the checkpoint's CogVideoXDDIMScheduler) and L113-127 get_dummy_inputs (16x16; 9 frames "
                "here, 4k+1 as 49, instead of 8)",
    },
)

"""SDXL base 1.0: StableDiffusionXLPipeline at 1024x1024, guidance 5.0 with negative prompt embeddings, Euler.

The denoiser is a UNet (`unet`), not a transformer. With both text encoders left out the pipeline takes
`prompt_embeds` [B, 77, 2048] (the penultimate hidden states of CLIP-L, 768, and OpenCLIP-bigG, 1280, concatenated)
and `pooled_prompt_embeds` [B, 1280] (OpenCLIP-bigG's projected pooled output), and the negatives of the same shapes.
`text_encoder_2=None` needs nothing more: 0.37.1's `__call__` (pipeline_stable_diffusion_xl.py L1121-1124) takes
`text_encoder_projection_dim` from `pooled_prompt_embeds.shape[-1]` when `text_encoder_2` is None, so the added time
embedding is 6 x 256 + 1280 = 2816 = the UNet's `projection_class_embeddings_input_dim`, as with the real encoder.
"""

from lab.run.scenario import Model, Scenario, text_embeds

HUB = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    config = pipe.unet.config
    # CLIP tokenizers pad to 77 tokens; the width is the UNet's cross-attention width (768 + 1280 = 2048).
    seq = 77 if size != "tiny" else 16
    embeds = text_embeds(batch, seq, config.cross_attention_dim, generator, device, dtype, negative=True)
    # The pooled width is what the added embedding leaves after the 6 micro-conditioning ids (2816 - 6 x 256 = 1280).
    pooled_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    pooled = text_embeds(batch, 1, pooled_dim, generator, device, dtype, negative=True)
    return {
        "prompt": None,
        **embeds,
        "pooled_prompt_embeds": pooled["prompt_embeds"][:, 0],
        "negative_pooled_prompt_embeds": pooled["negative_prompt_embeds"][:, 0],
    }


SCENARIO = Scenario(
    name="sdxl",
    pipeline_cls="diffusers.StableDiffusionXLPipeline",
    checkpoint="stabilityai/stable-diffusion-xl-base-1.0",
    description="StableDiffusionXLPipeline (SDXL base 1.0), 1024x1024, guidance_scale 5.0 + negative prompt, Euler",
    call={"height": 1024, "width": 1024, "guidance_scale": 5.0},
    tiny_call={"height": 16, "width": 16},  # latents 8 x 8 (a tiny VAE of two stages), which the UNet halves twice
    models={
        "unet": Model(
            cls="diffusers.UNet2DConditionModel",
            # unet/config.json of the checkpoint (keys equal to the class defaults left out: center_input_sample,
            # flip_sin_to_cos, freq_shift, downsample_padding, mid_block_scale_factor, act_fn, norm_eps, conv kernels,
            # addition_embed_type_num_heads 64, time_embedding_type "positional"; upcast_attention null = False)
            full={
                "sample_size": 128, "in_channels": 4, "out_channels": 4,
                "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                "mid_block_type": "UNetMidBlock2DCrossAttn",
                "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                "block_out_channels": [320, 640, 1280], "layers_per_block": 2, "norm_num_groups": 32,
                "cross_attention_dim": 2048, "transformer_layers_per_block": [1, 2, 10],
                "attention_head_dim": [5, 10, 20], "use_linear_projection": True,
                "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
                "projection_class_embeddings_input_dim": 2816,
            },
            # the test's two stages plus a third, as the checkpoint has: a cross-attention stage that is not the last
            # one downsamples (unet_2d_blocks.py L1285-1289 in 0.37.1), which two stages never run
            tiny={
                "block_out_channels": [2, 4, 4], "layers_per_block": 2, "sample_size": 32, "in_channels": 4,
                "out_channels": 4, "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                "attention_head_dim": [2, 4, 4],
                "use_linear_projection": True, "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
                "transformer_layers_per_block": [1, 2, 2], "projection_class_embeddings_input_dim": 80,  # 6 * 8 + 32
                "cross_attention_dim": 64, "norm_num_groups": 1,
            },
            # No key counts transformer blocks as one number: `transformer_layers_per_block` is a per-stage list
            # ([1, 2, 10]) that `Scenario.config` cannot cap with min(), so `--layers` leaves the UNet whole.
            blocks=(),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKL",
            # vae/config.json; force_upcast True: the pipeline decodes in fp32 when the VAE is fp16 (L1254-1257),
            # not in bf16, so the VAE keeps the scenario dtype as `from_pretrained(torch_dtype=...)` gives it.
            full={
                "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4, "block_out_channels": [128, 256, 512, 512],
                "layers_per_block": 2, "act_fn": "silu", "latent_channels": 4, "norm_num_groups": 32,
                "sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True,
            },
            tiny={
                "block_out_channels": [32, 64], "in_channels": 3, "out_channels": 3,
                "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
                "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"], "latent_channels": 4, "sample_size": 128,
            },
        ),
    },
    scheduler=(
        "diffusers.EulerDiscreteScheduler",
        # scheduler/scheduler_config.json (the keys EulerDiscreteScheduler does not take and `from_config` drops,
        # clip_sample, set_alpha_to_one, skip_prk_steps, sample_max_value, left out)
        {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
         "prediction_type": "epsilon", "interpolation_type": "linear", "use_karras_sigmas": False,
         "timestep_spacing": "leading", "steps_offset": 1},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "unet": f"{HUB}/unet/config.json (not fetchable here; the same values in several public verbatim copies of "
                "it, e.g. Nunchaku's SDXL fallback config and maxdiffusion's SDXL UNet test; stage depths [1, 2, 10] "
                "and 2.6B UNet parameters in the SDXL paper, arXiv:2307.01952 section 2.1)",
        "vae": f"{HUB}/vae/config.json (public verbatim copies); scripts/convert_sd3_to_diffusers.py L331-338 builds "
               "the SD3 VAE from this same config",
        "scheduler": f"{HUB}/scheduler/scheduler_config.json (public verbatim copies, _diffusers_version 0.19.0.dev0)",
        "call": "pipeline_stable_diffusion_xl.py: docstring example `pipe(prompt)` at the UNet's 128 x 8 = 1024 "
                "default size, guidance_scale default 5.0 (L833); negative embeddings of the prompt's shapes",
        "prompt_embeds": "encode_prompt (L415-470): hidden_states[-2] of CLIP-L (768) and OpenCLIP-bigG (1280) "
                         "concatenated, 77 tokens; pooled = text_encoder_2 projection (projection_dim 1280)",
        "tiny": "tests/pipelines/stable_diffusion_xl/test_stable_diffusion_xl.py get_dummy_components L84-121",
    },
)

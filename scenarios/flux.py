"""FLUX.1-dev: FluxPipeline at 1024x1024 with embedded guidance 3.5 (one transformer call per step)."""

from lab.run.scenario import Model, Scenario, randn

UPSTREAM = "diffusers-upstream.md section D.1"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    config = pipe.transformer.config
    seq = 512 if size != "tiny" else 48
    return {
        "prompt": None,
        # T5-v1.1-XXL last_hidden_state and CLIP-L pooler_output stand in for the two text encoders.
        "prompt_embeds": randn((batch, seq, config.joint_attention_dim), generator, device, dtype, 0.5),
        "pooled_prompt_embeds": randn((batch, config.pooled_projection_dim), generator, device, dtype, 0.5),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="flux",
    pipeline_cls="diffusers.FluxPipeline",
    checkpoint="black-forest-labs/FLUX.1-dev",
    description="FluxPipeline, 1024x1024, guidance_scale 3.5 (embedded guidance)",
    call={"height": 1024, "width": 1024, "guidance_scale": 3.5},
    tiny_call={"height": 8, "width": 8},
    models={
        "transformer": Model(
            cls="diffusers.FluxTransformer2DModel",
            # class defaults are FLUX.1-dev (19 double / 38 single blocks, 24 x 128); dev adds guidance_embeds.
            full={"guidance_embeds": True},
            tiny={
                "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
                "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
                "axes_dims_rope": [4, 4, 8], "guidance_embeds": True,
            },
            blocks=("num_layers", "num_single_layers"),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKL",
            full={
                "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4, "block_out_channels": [128, 256, 512, 512],
                "layers_per_block": 2, "latent_channels": 16, "norm_num_groups": 32, "sample_size": 1024,
                "scaling_factor": 0.3611, "shift_factor": 0.1159, "use_quant_conv": False,
                "use_post_quant_conv": False, "force_upcast": True, "mid_block_add_attention": True,
            },
            tiny={
                "sample_size": 32, "block_out_channels": [4], "layers_per_block": 1, "latent_channels": 1,
                "norm_num_groups": 1, "use_quant_conv": False, "use_post_quant_conv": False,
                "shift_factor": 0.0609, "scaling_factor": 1.5035,
            },
        ),
    },
    scheduler=(
        "diffusers.FlowMatchEulerDiscreteScheduler",
        {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
         "base_image_seq_len": 256, "max_image_seq_len": 4096},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{UPSTREAM}: class defaults + guidance_embeds=True (convert_flux_to_diffusers.py L277-289)",
        "vae": f"{UPSTREAM}: SD3 VAE config with FLUX scale/shift (converter L299-300)",
        "scheduler": f"{UPSTREAM}: shift 3.0 + dynamic shifting (third-party report of the dev config)",
        "prompt_embeds": f"{UPSTREAM}: T5-XXL [B, 512, 4096], CLIP-L pooled [B, 768]",
        "tiny": "diffusers-upstream.md section F (tests/pipelines/flux get_dummy_components)",
    },
)

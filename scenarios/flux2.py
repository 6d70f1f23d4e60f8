"""FLUX.2 [klein] base 9B: Flux2KleinPipeline at 1024x1024 with CFG (guidance_scale 3.5, two calls per step)."""

from lab.run.scenario import Model, Scenario, text_embeds

UPSTREAM = "diffusers-upstream.md section D.2"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    seq = 512 if size != "tiny" else 64
    dim = pipe.transformer.config.joint_attention_dim
    # Qwen3-8B hidden states of layers (9, 18, 27), stacked: [B, 512, 3 x 4096]; CFG needs the negative too.
    embeds = text_embeds(batch, seq, dim, generator, device, dtype, negative=True)
    return {"prompt": None, **embeds, "max_sequence_length": seq}


SCENARIO = Scenario(
    name="flux2",
    pipeline_cls="diffusers.Flux2KleinPipeline",
    checkpoint="black-forest-labs/FLUX.2-klein-base-9B",
    description="Flux2KleinPipeline (Klein base 9B), 1024x1024, guidance_scale 3.5 (CFG on)",
    call={"height": 1024, "width": 1024, "guidance_scale": 3.5},
    tiny_call={"height": 8, "width": 8},
    models={
        "transformer": Model(
            cls="diffusers.Flux2Transformer2DModel",
            full={"num_layers": 8, "num_single_layers": 24, "num_attention_heads": 32,
                  "joint_attention_dim": 12288, "guidance_embeds": False},
            tiny={
                "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
                "num_attention_heads": 2, "joint_attention_dim": 16, "timestep_guidance_channels": 256,
                "axes_dims_rope": [4, 4, 4, 4], "guidance_embeds": False,
            },
            blocks=("num_layers", "num_single_layers"),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLFlux2",
            full={},
            tiny={
                "sample_size": 32, "down_block_types": ["DownEncoderBlock2D"], "up_block_types": ["UpDecoderBlock2D"],
                "block_out_channels": [4], "layers_per_block": 1, "latent_channels": 1, "norm_num_groups": 1,
                "use_quant_conv": False, "use_post_quant_conv": False,
            },
        ),
    },
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"shift": 3.0, "use_dynamic_shifting": True}),
    pipeline_kwargs={"is_distilled": False},
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{UPSTREAM}: get_flux2_transformer_config('klein-9b'), convert_flux2_to_diffusers.py L430-447",
        "vae": f"{UPSTREAM}: AutoencoderKLFlux2() defaults (converter L488; uncertain)",
        "scheduler": f"{UPSTREAM}: FLUX.1-dev scheduler copied by the converter (uncertain)",
        "is_distilled": f"{UPSTREAM}: False for 'base' (inferred; uncertain)",
        "prompt_embeds": f"{UPSTREAM}: [B, 512, 12288] + negative of the same shape",
        "tiny": "diffusers-upstream.md section F (tests/pipelines/flux2 Klein get_dummy_components)",
    },
)

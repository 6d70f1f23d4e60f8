"""Wan2.1 T2V 14B: WanPipeline at 480x832, 81 frames, guidance 5.0 with a negative prompt, UniPC in flow mode."""

from lab.run.scenario import Model, Scenario, text_embeds

UPSTREAM = "diffusers-upstream.md section D.3"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    seq = 512 if size != "tiny" else 16
    dim = pipe.transformer.config.text_dim
    # UMT5-XXL last_hidden_state; guidance 5.0 needs the negative prompt's embeddings of the same shape.
    embeds = text_embeds(batch, seq, dim, generator, device, dtype, negative=True)
    return {"prompt": None, **embeds, "max_sequence_length": seq}


SCENARIO = Scenario(
    name="wan",
    pipeline_cls="diffusers.WanPipeline",
    checkpoint="Wan-AI/Wan2.1-T2V-14B-Diffusers",
    description="WanPipeline (Wan2.1 T2V 14B), 480x832, 81 frames, guidance 5.0 + negative prompt, UniPC",
    call={"height": 480, "width": 832, "num_frames": 81, "guidance_scale": 5.0},
    tiny_call={"height": 16, "width": 16, "num_frames": 9},
    models={
        "transformer": Model(
            cls="diffusers.WanTransformer3DModel",
            full={},  # class defaults are exactly the 14B config
            tiny={
                "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 16,
                "out_channels": 16, "text_dim": 32, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2,
                "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32,
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLWan",
            full={},
            tiny={"base_dim": 3, "z_dim": 16, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
                  "temperal_downsample": [False, True, True]},
            dtype="float32",  # the Wan docs load the VAE in fp32
        ),
    },
    scheduler=(
        "diffusers.UniPCMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "num_train_timesteps": 1000, "flow_shift": 3.0},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{UPSTREAM}: WanTransformer3DModel defaults = get_transformer_config('Wan-T2V-14B')",
        "vae": f"{UPSTREAM}: AutoencoderKLWan() defaults, fp32 as in the docs",
        "scheduler": f"{UPSTREAM}: UniPC flow_prediction, flow_shift 3.0 (converter L1185-1193; 3.0 vs 5.0 uncertain)",
        "prompt_embeds": f"{UPSTREAM}: UMT5-XXL [B, 512, 4096] + negative",
        "tiny": "diffusers-upstream.md section F, with UniPC instead of the test's FlowMatchEuler so fixes 2/3 run",
    },
)

"""Qwen-Image: QwenImagePipeline at 1024x1024, true_cfg_scale 4.0 with a negative prompt."""

import torch

from lab.run.scenario import Model, Scenario, randn

UPSTREAM = "diffusers-upstream.md section D.5"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.joint_attention_dim
    # Qwen2.5-VL-7B hidden states, padded to the longest prompt: about 14 tokens for the harness prompt and 6 for
    # the negative " " (estimates, section D.5).
    seq, neg_seq = 14, 6
    return {
        "prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_embeds_mask": torch.ones((batch, seq), dtype=torch.int64, device=device),
        "negative_prompt_embeds": randn((batch, neg_seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_embeds_mask": torch.ones((batch, neg_seq), dtype=torch.int64, device=device),
    }


TRANSFORMER_TINY = {
    "patch_size": 2, "in_channels": 16, "out_channels": 4, "num_layers": 2, "attention_head_dim": 16,
    "num_attention_heads": 3, "joint_attention_dim": 16, "guidance_embeds": False, "axes_dims_rope": [8, 4, 4],
}
VAE = Model(
    cls="diffusers.AutoencoderKLQwenImage",
    full={},
    tiny={"base_dim": 24, "z_dim": 4, "dim_mult": [1, 2, 4], "num_res_blocks": 1, "temperal_downsample": [False, True],
          "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4},
)
SCHEDULER = (
    "diffusers.FlowMatchEulerDiscreteScheduler",
    {"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 8192, "max_shift": 0.9, "shift": 1.0,
     "shift_terminal": 0.02, "time_shift_type": "exponential", "use_dynamic_shifting": True},
)
SOURCES = {
    "transformer": f"{UPSTREAM}: QwenImageTransformer2DModel defaults (public config copies agree)",
    "vae": f"{UPSTREAM}: AutoencoderKLQwenImage() defaults",
    "scheduler": f"{UPSTREAM}: public copies of the Qwen-Image scheduler config",
    "prompt_embeds": f"{UPSTREAM}: [B, ~14, 3584] + mask; negative [B, ~6, 3584] (lengths estimated)",
    "tiny": "diffusers-upstream.md section F (tests/pipelines/qwenimage get_dummy_components)",
}

SCENARIO = Scenario(
    name="qwenimage",
    pipeline_cls="diffusers.QwenImagePipeline",
    checkpoint="Qwen/Qwen-Image",
    description="QwenImagePipeline, 1024x1024, true_cfg_scale 4.0 + negative prompt",
    call={"height": 1024, "width": 1024, "true_cfg_scale": 4.0},
    tiny_call={"height": 32, "width": 32},
    models={
        "transformer": Model(
            cls="diffusers.QwenImageTransformer2DModel", full={}, tiny=TRANSFORMER_TINY, blocks=("num_layers",)
        ),
        "vae": VAE,
    },
    scheduler=SCHEDULER,
    prompt_inputs=prompt_inputs,
    sources=SOURCES,
)

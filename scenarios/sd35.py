"""SD3.5 Large: StableDiffusion3Pipeline at 1024x1024, guidance 3.5 with a negative prompt, FlowMatch Euler shift 3.0.

The three text encoders are left out: `prompt_embeds` [B, 77 + 256, 4096] are CLIP-L (768) and OpenCLIP-bigG (1280)
penultimate hidden states concatenated (2048), zero-padded to T5's 4096 and followed along the sequence by the
T5-XXL `last_hidden_state` of `max_sequence_length` (default 256) tokens; `pooled_prompt_embeds` [B, 2048] are the two
CLIP projections concatenated. The lab passes None for all three encoders and tokenizers (`text_encoder_3` included),
as a user loading with `text_encoder_3=None, tokenizer_3=None` does.
"""

from lab.run.scenario import Model, Scenario, text_embeds

HUB = "https://huggingface.co/stabilityai/stable-diffusion-3.5-large/blob/main"
CONVERTER = "huggingface/diffusers scripts/convert_sd3_to_diffusers.py"
PIPELINE = "diffusers 0.37.1 pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py"

#: CLIP tokens (tokenizer_max_length) and T5 tokens (`max_sequence_length` default) per size
CLIP_TOKENS = {"full": 77, "tiny": 8}
T5_TOKENS = {"full": 256, "tiny": 8}


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    config = pipe.transformer.config
    seq = CLIP_TOKENS[size] + T5_TOKENS[size]
    # guidance 3.5 > 1: CFG, so the negative prompt's embeddings of the same shapes (encode_prompt encodes "" when
    # no negative prompt is given, so a user's run always has them).
    embeds = text_embeds(batch, seq, config.joint_attention_dim, generator, device, dtype, negative=True)
    pooled = text_embeds(batch, 1, config.pooled_projection_dim, generator, device, dtype, negative=True)
    return {
        "prompt": None,
        **embeds,
        "pooled_prompt_embeds": pooled["prompt_embeds"][:, 0],
        "negative_pooled_prompt_embeds": pooled["negative_prompt_embeds"][:, 0],
        "max_sequence_length": T5_TOKENS[size],
    }


SCENARIO = Scenario(
    name="sd35",
    pipeline_cls="diffusers.StableDiffusion3Pipeline",
    checkpoint="stabilityai/stable-diffusion-3.5-large",
    description="StableDiffusion3Pipeline (SD3.5 Large), 1024x1024, guidance_scale 3.5 + negative prompt, shift 3.0",
    call={"height": 1024, "width": 1024, "guidance_scale": 3.5},
    tiny_call={"height": 16, "width": 16},
    models={
        "transformer": Model(
            cls="diffusers.SD3Transformer2DModel",
            # transformer/config.json: 38 layers of 38 heads x 64 (2432 wide), QK RMSNorm. No dual-attention (MMDiT-X)
            # layers: those are SD3.5 Medium's; the Large config has no such key (the class default ()). sample_size
            # 128, patch 2, in/out 16, joint_attention_dim 4096 and pooled_projection_dim 2048 are class defaults.
            full={
                "num_layers": 38, "num_attention_heads": 38, "attention_head_dim": 64,
                "caption_projection_dim": 2432, "pos_embed_max_size": 192, "qk_norm": "rms_norm",
            },
            tiny={
                # 2 layers: the last block is `context_pre_only`, so one layer alone never runs the context
                # branch of a joint block (attention.py L699-746 in 0.37.1); qk_norm as the checkpoint's
                "sample_size": 32, "patch_size": 1, "in_channels": 4, "num_layers": 2, "attention_head_dim": 8,
                "num_attention_heads": 4, "caption_projection_dim": 32, "joint_attention_dim": 32,
                "pooled_projection_dim": 64, "out_channels": 4, "qk_norm": "rms_norm",
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKL",
            # vae/config.json: the SDXL VAE layout with 16 latent channels and no quant convs
            full={
                "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4, "block_out_channels": [128, 256, 512, 512],
                "layers_per_block": 2, "act_fn": "silu", "latent_channels": 16, "norm_num_groups": 32,
                "sample_size": 1024, "scaling_factor": 1.5305, "shift_factor": 0.0609, "force_upcast": True,
                "use_quant_conv": False, "use_post_quant_conv": False, "mid_block_add_attention": True,
            },
            tiny={
                "sample_size": 32, "in_channels": 3, "out_channels": 3, "block_out_channels": [4],
                "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 1, "use_quant_conv": False,
                "use_post_quant_conv": False, "shift_factor": 0.0609, "scaling_factor": 1.5035,
            },
        ),
    },
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 3.0}),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{HUB}/transformer/config.json (not fetchable here). {CONVERTER} L291-320 derives it from the "
                       "checkpoint: num_attention_heads = num_layers, caption_projection_dim = context_embedder "
                       "width, pos_embed_max_size 192 for 'sd3.0 and sd3.5 8b' (L301), qk_norm rms_norm for SD3.5, "
                       "attn2 layers only in SD3.5 Medium (L295); the same 38/38/64/2432/192/rms_norm in several "
                       "public copies of the Large config (e.g. tt-forge's SD3.5 Large loader, taproot)",
        "vae": f"{HUB}/vae/config.json; {CONVERTER} L331-338 (SDXL VAE config + latent_channels 16, no quant "
               "convs, scaling 1.5305, shift 0.0609); public copies of the SD3.5 vae/config.json agree",
        "scheduler": f"{HUB}/scheduler/scheduler_config.json: FlowMatchEulerDiscreteScheduler, shift 3.0 (SD3 "
                     "Medium's, which https://huggingface.co/blog/sd3-5 says SD3.5 keeps); not fetched here",
        "call": "SD3.5 Large model card example: 1024x1024 (sample_size 128 x 8), guidance_scale 3.5 (not fetched "
                "here; the diffusers SD3 docs use 7.0 for SD3 Medium)",
        "prompt_embeds": f"{PIPELINE} encode_prompt: CLIP 77 tokens (tokenizer_max_length) + T5 max_sequence_length "
                         "256 (default, L802) -> [B, 333, 4096]; pooled [B, 2048]",
        "tiny": "tests/pipelines/stable_diffusion_3/test_pipeline_stable_diffusion_3.py get_dummy_components L48-103",
    },
)

"""AuraFlow v0.3: AuraFlowPipeline at 1024x1024, guidance_scale 3.5 with a negative prompt (CFG as a batch of 2).

The text encoder is Pile-T5-XL (a UMT5EncoderModel, width 2048), padded to max_sequence_length 256. The pipeline
zeroes the padding positions of the embeddings with the mask (`prompt_embeds * prompt_attention_mask`) and then only
checks the masks (they must be given, of equal shapes); the transformer never sees them.
"""

import torch

from lab.run.scenario import Model, Scenario, randn, token_mask
from scenarios.sdxl import SCENARIO as SDXL

# Pile-T5 tokens (EOS included) of the harness prompt "A cat holding a sign that says hello world" and of the default
# negative prompt "": estimates (no Pile-T5 tokenizer here).
PROMPT_TOKENS, NEGATIVE_TOKENS = 11, 1


def _embeds_and_mask(batch, seq, dim, tokens, generator, device, dtype):
    """What `encode_prompt` returns for a prompt of `tokens` tokens: the T5 states with the padding zeroed, and the
    tokenizer's int64 mask (the pipeline reshapes it to [B, -1], so [B, seq] is what a user passes)."""
    mask = token_mask(batch, seq, tokens, "cpu")
    embeds = randn((batch, seq, dim), generator, "cpu", torch.float32, 0.5) * mask.unsqueeze(-1)
    return embeds.to(device=device, dtype=dtype), mask.to(device)


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.joint_attention_dim
    seq = 256 if size != "tiny" else 16
    tokens, negative_tokens = (PROMPT_TOKENS, NEGATIVE_TOKENS) if size != "tiny" else (8, 1)
    embeds, mask = _embeds_and_mask(batch, seq, dim, tokens, generator, device, dtype)
    negative, negative_mask = _embeds_and_mask(batch, seq, dim, negative_tokens, generator, device, dtype)
    return {
        "prompt": None,
        "prompt_embeds": embeds,
        "prompt_attention_mask": mask,
        "negative_prompt_embeds": negative,
        "negative_prompt_attention_mask": negative_mask,
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="auraflow",
    pipeline_cls="diffusers.AuraFlowPipeline",
    checkpoint="fal/AuraFlow-v0.3",
    description="AuraFlowPipeline (AuraFlow v0.3), 1024x1024, guidance_scale 3.5 + negative prompt",
    call={"height": 1024, "width": 1024, "guidance_scale": 3.5},
    tiny_call={"height": 32, "width": 32},
    models={
        "transformer": Model(
            cls="diffusers.AuraFlowTransformer2DModel",
            # class defaults are the v0.3 config (4 MMDiT + 32 single-DiT layers, 12 x 256 heads, T5 width 2048)
            # except the position table: 96 x 96 = 9216 positions (multi-aspect-ratio v0.3; class default 1024).
            full={"pos_embed_max_size": 9216},
            tiny={
                "sample_size": 32, "patch_size": 2, "in_channels": 4, "num_mmdit_layers": 1,
                "num_single_dit_layers": 1, "attention_head_dim": 8, "num_attention_heads": 4,
                "caption_projection_dim": 32, "joint_attention_dim": 32, "out_channels": 4, "pos_embed_max_size": 256,
            },
            blocks=("num_mmdit_layers", "num_single_dit_layers"),
        ),
        "vae": SDXL.models["vae"],  # the SDXL VAE (4 latent channels, scaling 0.13025)
    },
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 1.73}),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": "p1atdev/vision-ft src/models/auraflow/denoiser.py DEFAULT_DENOISER_CONFIG and config.py "
                       "(pretrained_model_name_or_path fal/AuraFlow-v0.3, pos_embed_max_size 96 * 96): heads/dims/"
                       "layers = the 0.37.1 class defaults, pos_embed_max_size 9216. scripts/"
                       "convert_aura_flow_to_diffusers.py builds the model from class defaults plus layer counts "
                       "read off the checkpoint. Hub transformer/config.json not seen directly",
        "vae": "SDXL VAE config (scenarios/sdxl.py): p1atdev/vision-ft src/models/auraflow/vae.py (AutoencoderKL, "
               "4 latent channels, scaling_factor 0.13025, sample_size 1024, force_upcast); ComfyUI "
               "comfy/supported_models.py AuraFlow latent_format = SDXL",
        "scheduler": "FlowMatchEulerDiscreteScheduler shift 1.73: ComfyUI comfy/supported_models.py AuraFlow "
                     "sampling_settings; p1atdev/vision-ft src/models/auraflow/scheduler.py default shift 1.73. Hub "
                     "scheduler_config.json not seen directly",
        "call": "pipeline_aura_flow.py __call__ defaults: height/width 1024, guidance_scale 3.5 (L436-439), "
                "max_sequence_length 256 (L446); docstring example `pipe(prompt)` with the harness prompt "
                "(checkpoint fal/AuraFlow there; the docs page has no call settings)",
        "prompt_embeds": "pipeline_aura_flow.py encode_prompt (L232-372): Pile-T5-XL last_hidden_state [B, 256, 2048] "
                         "(padding='max_length') times the mask; negative '' the same shape (check_inputs L212-230). "
                         "Token counts estimated (11 / 1)",
        "tiny": "tests/pipelines/aura_flow/test_pipeline_aura_flow.py get_dummy_components (transformer; its VAE is "
                "the sdxl scenario's tiny VAE)",
    },
)

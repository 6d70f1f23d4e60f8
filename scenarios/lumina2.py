"""Lumina-Image 2.0: Lumina2Pipeline at 1024x1024, guidance_scale 4.0, cfg_trunc_ratio 0.25, cfg_normalization on.

The model card's diffusers example. Guidance is a second transformer call per step (the negative prompt, "" by
default), and `cfg_trunc_ratio` 0.25 drops it once (i + 1) / steps > 0.25: at the lab's 4 steps only step 0 runs
both calls (5 transformer calls in all). The transformer takes the Gemma-2-2B masks: it reads each caption's length
from `encoder_attention_mask.sum(dim=1).tolist()` every forward (transformer_lumina2.py L271).
"""


from lab.run.scenario import Model, Scenario, randn, token_mask
from scenarios.flux import SCENARIO as FLUX

# Gemma tokens of the prompt as the pipeline builds it: BOS + the system prompt + " <Prompt Start> " + the prompt.
# An estimate (no Gemma tokenizer here): sglang's Lumina-2 test puts a caption "with the system prompt" at ~40 tokens;
# the harness prompt adds about 9. The negative prompt "" is the BOS token alone.
PROMPT_TOKENS, NEGATIVE_TOKENS = 44, 1


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.cap_feat_dim
    seq = 256 if size != "tiny" else 16
    tokens, negative_tokens = (PROMPT_TOKENS, NEGATIVE_TOKENS) if size != "tiny" else (8, 1)
    # Gemma-2-2B hidden_states[-2], padded to max_sequence_length (default 256); check_inputs requires the masks and
    # the negative embeddings of the prompt's shape.
    return {
        "prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": token_mask(batch, seq, tokens, device),
        "negative_prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_attention_mask": token_mask(batch, seq, negative_tokens, device),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="lumina2",
    pipeline_cls="diffusers.Lumina2Pipeline",
    checkpoint="Alpha-VLLM/Lumina-Image-2.0",
    description="Lumina2Pipeline, 1024x1024, guidance_scale 4.0, cfg_trunc_ratio 0.25, cfg_normalization",
    call={"height": 1024, "width": 1024, "guidance_scale": 4.0, "cfg_trunc_ratio": 0.25, "cfg_normalization": True},
    tiny_call={"height": 32, "width": 32},
    models={
        "transformer": Model(
            cls="diffusers.Lumina2Transformer2DModel",
            # the hub transformer/config.json is the class defaults (2304 wide, 26 layers + 2 refiner layers, 24 heads,
            # 8 KV heads) except cap_feat_dim, the Gemma-2-2B width (class default 1024).
            full={"cap_feat_dim": 2304},
            tiny={
                "sample_size": 4, "patch_size": 2, "in_channels": 4, "hidden_size": 8, "num_layers": 2,
                "num_attention_heads": 1, "num_kv_heads": 1, "multiple_of": 16, "ffn_dim_multiplier": None,
                "norm_eps": 1e-5, "scaling_factor": 1.0, "axes_dim_rope": [4, 2, 2], "cap_feat_dim": 8,
            },
            blocks=("num_layers", "num_refiner_layers"),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKL",
            full=FLUX.models["vae"].full,  # the FLUX.1-dev VAE, verbatim
            tiny={
                "sample_size": 32, "in_channels": 3, "out_channels": 3, "block_out_channels": [4],
                "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 1, "use_quant_conv": False,
                "use_post_quant_conv": False, "shift_factor": 0.0609, "scaling_factor": 1.5035,
            },
        ),
    },
    # The pipeline passes its own sigmas (linspace(1, 1/steps)) and mu; without dynamic shifting, shift 6.0 applies.
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 6.0}),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": "Alpha-VLLM/Lumina-Image-2.0 transformer/config.json, quoted verbatim (_diffusers_version "
                       "0.33.0.dev0) as LUMINA2_CHECKPOINT_CONFIG in sgl-project/sglang's multimodal_gen Lumina-2 "
                       "unit test (test_lumina2.py); all keys but cap_feat_dim 2304 equal the 0.37.1 class defaults",
        "vae": "sgl-project/sglang python/sglang/multimodal_gen/configs/pipeline_configs/lumina2.py: 'Lumina-2 ships "
               "the FLUX.1-dev VAE verbatim (vae/config.json records _name_or_path: black-forest-labs/FLUX.1-dev)'; "
               "kohya-ss sd-scripts docs: the Lumina AE is FLUX.1's ae.safetensors. Config = scenarios/flux.py VAE",
        "scheduler": "FlowMatchEulerDiscreteScheduler shift 6.0: sglang test_lumina2.py ('the scheduler's own default "
                     "grid -- shift=6.0'); the other keys (use_dynamic_shifting False) are class defaults, NOT seen in "
                     "the hub scheduler_config.json",
        "call": "Alpha-VLLM/Lumina-Image-2.0 model card diffusers example (public verbatim copies): height/width 1024, "
                "guidance_scale 4.0, cfg_trunc_ratio 0.25, cfg_normalization True; pipeline_lumina2.py __call__ "
                "defaults guidance 4.0, cfg_trunc_ratio 1.0, max_sequence_length 256 (L526-551). The diffusers docs "
                "page (docs/source/en/api/pipelines/lumina2.md) calls pipe(prompt) with the defaults",
        "prompt_embeds": "pipeline_lumina2.py _get_gemma_prompt_embeds (L192-235): Gemma-2-2B hidden_states[-2] "
                         "[B, 256, 2304] padded to max_length + int64 mask; negative '' the same shape (check_inputs "
                         "L415-420); prompt/negative token counts estimated (44 / 1)",
        "tiny": "tests/pipelines/lumina2/test_pipeline_lumina2.py get_dummy_components (transformer and VAE)",
    },
)

"""Z-Image-Turbo: ZImagePipeline at 1024x1024, guidance_scale 0.0 (distilled: one transformer call per step, no CFG).

The pipeline docstring example (1024x1024, 9 steps, guidance_scale 0.0; the docs page's Turbo img2img and inpaint
examples use 8 steps, guidance_scale 0.0). With guidance 0 there is no negative prompt. The pipeline takes `prompt_embeds` as a LIST of
per-prompt tensors [seq_i, 2560]: `_encode_prompt` keeps only each prompt's real tokens (`prompt_embeds[i][mask[i]]`,
no padding to max_sequence_length); the transformer pads each caption to a multiple of 32 with its `cap_pad_token`.

`x_pad_token` and `cap_pad_token` are made with `torch.empty` in `ZImageTransformer2DModel.__init__` (the checkpoint
fills them); with random weights they hold whatever memory they got (diffusers' tests set them to ones for that
reason). The caption here (about 70 tokens, padded to 96) does use `cap_pad_token`; the 1024x1024 image (4096
tokens) needs no `x_pad_token`.
"""

from lab.run.scenario import Model, Scenario, randn
from scenarios.flux import SCENARIO as FLUX

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
PIPELINE = "diffusers 0.37.1 pipelines/z_image/pipeline_z_image.py"
TEST = f"{DIFFUSERS}/tests/pipelines/z_image/test_z_image.py"
HUB = "https://huggingface.co/Tongyi-MAI/Z-Image-Turbo/blob/main"
COPIES = ("third-party verbatim copies of the hub configs found with the code search (Rust config tests "
          "'Verbatim Tongyi-MAI/Z-Image-Turbo upstream configs', MLX converters citing the hub URL); hub not reachable")

#: real tokens of the docstring prompt (92 Chinese characters) in the Qwen3 chat template (user turn + generation
#: prompt, enable_thinking=True adds no empty think block): about 70, an estimate (the tokenizer cannot be loaded here)
PROMPT_TOKENS = {"full": 70, "tiny": 10}


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.cap_feat_dim
    seq = PROMPT_TOKENS["tiny" if size == "tiny" else "full"]
    # Qwen3-4B hidden_states[-2] at the prompt's real tokens, one [seq, 2560] tensor per prompt.
    return {
        "prompt": None,
        "prompt_embeds": [randn((seq, dim), generator, device, dtype, 0.5) for _ in range(batch)],
    }


SCENARIO = Scenario(
    name="zimage",
    pipeline_cls="diffusers.ZImagePipeline",
    checkpoint="Tongyi-MAI/Z-Image-Turbo",
    description="ZImagePipeline (Z-Image-Turbo), 1024x1024, guidance_scale 0.0 (distilled, no CFG)",
    call={"height": 1024, "width": 1024, "guidance_scale": 0.0},
    tiny_call={"height": 32, "width": 32},
    models={
        "transformer": Model(
            cls="diffusers.ZImageTransformer2DModel",
            # class defaults (dim 3840, 30 layers, 2 refiner layers, 30 heads, cap_feat_dim 2560, axes_dims
            # [32, 48, 48]) except axes_lens, which the checkpoint sets to [1536, 512, 512]
            full={"axes_lens": [1536, 512, 512]},
            tiny={
                "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 32, "n_layers": 2,
                "n_refiner_layers": 1, "n_heads": 2, "n_kv_heads": 2, "norm_eps": 1e-5, "qk_norm": True,
                "cap_feat_dim": 16, "rope_theta": 256.0, "t_scale": 1000.0, "axes_dims": [8, 4, 4],
                "axes_lens": [256, 32, 32],
            },
            blocks=("n_layers",),  # the 2+2 refiner blocks stay (as Hunyuan's token refiner)
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKL",
            # the FLUX.1 VAE config, scenarios/flux.py's: 4 blocks [128, 256, 512, 512], 16 latent channels
            full=FLUX.models["vae"].full,
            tiny={
                "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 2,
                "up_block_types": ["UpDecoderBlock2D"] * 2, "block_out_channels": [32, 64], "layers_per_block": 1,
                "latent_channels": 16, "norm_num_groups": 32, "sample_size": 32, "scaling_factor": 0.3611,
                "shift_factor": 0.1159,
            },
        ),
    },
    # static shift 3.0 (use_dynamic_shifting false: the `mu` the pipeline computes is not used)
    scheduler=(
        "diffusers.FlowMatchEulerDiscreteScheduler",
        {"num_train_timesteps": 1000, "use_dynamic_shifting": False, "shift": 3.0},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{HUB}/transformer/config.json via {COPIES}; they agree with each other",
        "vae": f"{HUB}/vae/config.json via {COPIES} (the copies list no block types; 4 of each follow from the 4 "
               "block_out_channels, as in the FLUX.1 VAE)",
        "scheduler": f"{HUB}/scheduler/scheduler_config.json via {COPIES}",
        "call": f"{PIPELINE} EXAMPLE_DOC_STRING (1024x1024, 9 steps, guidance_scale 0.0); "
                "docs/source/en/api/pipelines/z_image.md L38-50 (Turbo img2img: 8 steps, guidance 0.0)",
        "prompt_embeds": f"{PIPELINE} _encode_prompt: list of [seq_i, 2560] (Qwen3-4B hidden_size 2560 = "
                         "cap_feat_dim), about 70 real tokens (estimate)",
        "tiny": f"{TEST} get_dummy_components (32x32; max_sequence_length 16 there, 10 real tokens here)",
    },
)

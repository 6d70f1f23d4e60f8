"""HunyuanVideo: HunyuanVideoPipeline at 320x512, 61 frames, embedded guidance 6.0 (one transformer call per step).

The pipeline docstring example of hunyuanvideo-community/HunyuanVideo (320x512, 61 frames, 30 steps; guidance_scale
left at its default 6.0, which is the transformer's embedded guidance: true_cfg_scale stays 1.0, so there is no
negative prompt and no second transformer call). The docs page's examples keep the default 720x1280 with 61 frames.
"""

import torch

from lab.run.scenario import Model, Scenario, randn

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
CONVERTER = f"{DIFFUSERS}/scripts/convert_hunyuan_video_to_diffusers.py"
PIPELINE = "diffusers 0.37.1 pipelines/hunyuan_video/pipeline_hunyuan_video.py"
TEST = f"{DIFFUSERS}/tests/pipelines/hunyuan_video/test_hunyuan_video.py"

#: real tokens of the docstring prompt "A cat walks on the grass, realistic" after the template is cropped: about
#: 8 word tokens + <|eot_id|> (an estimate: the llava-llama-3 tokenizer cannot be loaded here)
PROMPT_TOKENS = 9


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    config = pipe.transformer.config
    # max_sequence_length 256 (the pipeline default): the Llama tokenizer pads the templated prompt to 256 + crop_start
    # (95) tokens, the pipeline crops the 95 template tokens, so [B, 256, 4096] with the mask 1 for the prompt's
    # tokens then 0 (right padding, the converter's tokenizer padding_side="right").
    seq = 256 if size != "tiny" else 16
    real = min(seq, PROMPT_TOKENS)
    mask = torch.zeros((batch, seq), dtype=torch.int64)
    mask[:, :real] = 1
    return {
        "prompt": None,
        # llava-llama-3-8b hidden_states[-3] (num_hidden_layers_to_skip=2) and CLIP-L pooler_output
        "prompt_embeds": randn((batch, seq, config.text_embed_dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": mask.to(device),
        "pooled_prompt_embeds": randn((batch, config.pooled_projection_dim), generator, device, dtype, 0.5),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="hunyuan_video",
    pipeline_cls="diffusers.HunyuanVideoPipeline",
    checkpoint="hunyuanvideo-community/HunyuanVideo",
    description="HunyuanVideoPipeline, 320x512, 61 frames, guidance_scale 6.0 (embedded guidance)",
    call={"height": 320, "width": 512, "num_frames": 61, "guidance_scale": 6.0},
    tiny_call={"height": 16, "width": 16, "num_frames": 9},
    models={
        "transformer": Model(
            cls="diffusers.HunyuanVideoTransformer3DModel",
            # class defaults are exactly the converter's "HYVideo-T/2-cfgdistill" config (the T2V checkpoint):
            # 20 double / 40 single blocks, 24 x 128, guidance_embeds=True, text 4096, pooled 768
            full={},
            tiny={
                "in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 10,
                "num_layers": 1, "num_single_layers": 1, "num_refiner_layers": 1, "patch_size": 1,
                "patch_size_t": 1, "guidance_embeds": True, "text_embed_dim": 16, "pooled_projection_dim": 8,
                "rope_axes_dim": [2, 4, 4],
            },
            blocks=("num_layers", "num_single_layers"),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLHunyuanVideo",
            full={},  # the converter builds AutoencoderKLHunyuanVideo() with its defaults
            tiny={
                "in_channels": 3, "out_channels": 3, "latent_channels": 4,
                "down_block_types": ["HunyuanVideoDownBlock3D"] * 4, "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
                "block_out_channels": [8, 8, 8, 8], "layers_per_block": 1, "act_fn": "silu", "norm_num_groups": 4,
                "scaling_factor": 0.476986, "spatial_compression_ratio": 8, "temporal_compression_ratio": 4,
                "mid_block_add_attention": True,
            },
            # the docs recommend the VAE in fp16 and the transformer in bf16; the lab builds one dtype for all
        ),
    },
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"shift": 7.0}),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{CONVERTER} L145-164 TRANSFORMER_CONFIGS['HYVideo-T/2-cfgdistill'] (= class defaults)",
        "vae": f"{CONVERTER} L248: AutoencoderKLHunyuanVideo() defaults",
        "scheduler": f"{CONVERTER} L281 (--flow_shift default 7.0) and L321: FlowMatchEulerDiscreteScheduler(shift=7.0);"
                     " the hub scheduler_config.json itself not seen",
        "call": f"{PIPELINE} EXAMPLE_DOC_STRING (320x512, 61 frames) and __call__ defaults (guidance_scale 6.0,"
                " true_cfg_scale 1.0, max_sequence_length 256); docs/source/en/api/pipelines/hunyuan_video.md L71",
        "prompt_embeds": f"{PIPELINE} _get_llama_prompt_embeds (crop_start 95, max_sequence_length 256): "
                         "[B, 256, 4096] + int64 mask (about 9 real tokens: estimate); CLIP-L pooled [B, 768]",
        "tiny": f"{TEST} get_dummy_components / get_dummy_inputs (16x16, 9 frames, max_sequence_length 16)",
    },
)

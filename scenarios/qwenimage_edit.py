"""Qwen-Image-Edit: QwenImageEditPipeline at 1024x1024 with a 1024x1024 input image, true_cfg_scale 4.0 with a
negative prompt (two transformer calls per step).

The same transformer, VAE and scheduler as `qwenimage` (Qwen-Image-Edit is the Qwen-Image 20B MMDiT fine-tuned for
editing). The input image goes twice into the model: through the VAE, as 4096 image-latent tokens appended to the 4096
noise tokens, and through Qwen2.5-VL, as 1369 vision tokens inside the prompt embeddings, which makes them about
1400 tokens long instead of Qwen-Image's ~14.

With `prompt_embeds` and `prompt_embeds_mask` given, `encode_prompt` calls neither the processor nor the text
encoder (0.37.1 L303-304), so the pipeline is built with `processor=None` as with `text_encoder=None`; the masks are
required (`check_inputs`), and an all-ones mask is turned into None as the pipeline's own would be.

The pipeline always resizes the input image to a 1024x1024-area size (`calculate_dimensions(1024 * 1024, ...)`,
whatever the call's height/width), so the tiny VAE downsamples by 32 (5 down stages, base_dim 2) instead of
`qwenimage`'s 4, which keeps the tiny run's image tokens at 16 x 16 instead of 128 x 128.
"""

import dataclasses

import torch

from lab.run.scenario import Scenario, random_images, randn
from scenarios.qwenimage import SCENARIO as QWENIMAGE
from scenarios.qwenimage import SCHEDULER, SOURCES, VAE

IMAGE_SIZE = 1024
# Qwen2.5-VL hidden states after the template's first 64 tokens are dropped: <|vision_start|>, 37 x 37 = 1369
# <|image_pad|>, <|vision_end|>, the prompt, then the 5-token tail (<|im_end|> \n <|im_start|> assistant \n).
VISION_TOKENS = 1 + (1036 // 28) ** 2 + 1
TAIL = 5
PROMPT_TOKENS, NEGATIVE_TOKENS = 23, 1  # the docs example's prompt (estimate) and the model card's negative " "


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    dim = pipe.transformer.config.joint_attention_dim
    if size != "tiny":
        seq = VISION_TOKENS + PROMPT_TOKENS + TAIL  # 1399
        neg_seq = VISION_TOKENS + NEGATIVE_TOKENS + TAIL  # 1377
    else:
        seq, neg_seq = 24, 12
    image = random_images(IMAGE_SIZE, IMAGE_SIZE, 1, generator)[0]
    return {
        "image": image,
        "prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_embeds_mask": torch.ones((batch, seq), dtype=torch.int64, device=device),
        "negative_prompt_embeds": randn((batch, neg_seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_embeds_mask": torch.ones((batch, neg_seq), dtype=torch.int64, device=device),
    }


VAE_TINY = {
    # tests/pipelines/qwenimage/test_qwenimage_edit.py's tiny VAE, 5 down stages deep (vae_scale_factor 2**5 = 32)
    "base_dim": 2, "z_dim": 4, "dim_mult": [1] * 6, "num_res_blocks": 1,
    "temperal_downsample": [False, True, True, True, True], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4,
}

SCENARIO = Scenario(
    name="qwenimage_edit",
    pipeline_cls="diffusers.QwenImageEditPipeline",
    checkpoint="Qwen/Qwen-Image-Edit",
    description="QwenImageEditPipeline, 1024x1024, 1024x1024 input image, true_cfg_scale 4.0 + negative prompt",
    call={"height": 1024, "width": 1024, "true_cfg_scale": 4.0},
    tiny_call={"height": 128, "width": 128},
    models={
        "transformer": QWENIMAGE.models["transformer"],
        "vae": dataclasses.replace(VAE, tiny=VAE_TINY),
    },
    scheduler=SCHEDULER,
    prompt_inputs=prompt_inputs,
    sources={
        **SOURCES,
        "transformer": SOURCES["transformer"] + "; Qwen-Image-Edit's own transformer/config.json could not be read "
                       "here (unverified): the Edit model is the 20B Qwen-Image MMDiT fine-tuned, and "
                       "zero_cond_t only came with Edit-2511 (diffusers-upstream.md section A, fix 6)",
        "vae": SOURCES["vae"] + " (Qwen-Image-Edit ships the Qwen-Image VAE; its config unverified here)",
        "scheduler": SOURCES["scheduler"] + " (Qwen-Image-Edit's own scheduler_config.json unverified here)",
        "call": "pipeline_qwenimage_edit.py docstring example (0.37.1 L51-61): pipe(image, prompt), true_cfg_scale "
                "default 4.0 (L556); height/width = calculate_dimensions(1024*1024, 1.0) = 1024 for a square image; "
                "the negative prompt ' ' of the Qwen-Image-Edit model card (not verifiable here)",
        "prompt_embeds": "Qwen2.5-VL-7B last hidden state, width 3584 (joint_attention_dim). Length 1399 (negative "
                         "1377) computed, not measured: the template (pipeline L213-214) keeps everything from "
                         "<|vision_start|> on (drop_idx 64 = system part + '<|im_start|>user\\n'); the processor "
                         "gets the 1024x1024 resized image, and Qwen2-VL's smart_resize (factor 28 = patch 14 x "
                         "merge 2; default max_pixels 12845056 does not bind) makes it 1036x1036 = 37x37 = 1369 "
                         "<|image_pad|> tokens; + 2 vision delimiters + prompt + 5-token tail. The prompt's 23 "
                         "tokens (docs example) and the negative's 1 are estimates (no Qwen tokenizer here); the "
                         "processor config is assumed to be Qwen2.5-VL's default",
        "image": "random 1024x1024 RGB (lab.run.scenario.random_images): 4096 image-latent tokens at full size",
        "tiny": "tests/pipelines/qwenimage/test_qwenimage_edit.py get_dummy_components (transformer as `qwenimage` "
                "tiny; VAE 5 stages deep, see the module docstring)",
    },
)

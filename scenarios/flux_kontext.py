"""FLUX.1-Kontext-dev: FluxKontextPipeline at 1024x1024 with a 1024x1024 input image, embedded guidance 2.5.

One transformer call per step (guidance-distilled, no true CFG); the input image is encoded by the VAE once and its
latents (4096 tokens at 1024x1024) are appended to the 4096 noise tokens in every transformer call.

The transformer and VAE are FLUX.1-dev's (`scenarios/flux.py`): Kontext-dev is the FLUX.1-dev 12B DiT fine-tuned on
image + text, with the same 19 double / 38 single blocks, 24 x 128 heads and `guidance_embeds`. Only the tiny VAE
differs from `flux`'s: the pipeline resizes any input image to a ~1 MP Kontext resolution (`_auto_resize`, on as a
user runs it), so the tiny VAE downsamples by 32 instead of 1 (6 one-channel-wide blocks instead of 1) to keep the
image tokens of the tiny run at 16 x 16 instead of 512 x 512. `max_area` (the output area the pipeline rescales
height/width to, default 1024**2) is set to the call's height x width at both sizes.
"""

import dataclasses

from lab.run.scenario import random_images
from scenarios.flux import SCENARIO as FLUX
from scenarios.flux import prompt_inputs as flux_prompt_inputs

IMAGE_SIZE = 1024  # the input image; the pipeline resizes it to the preferred Kontext resolution (1024x1024 here)


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    """The text embeddings of `flux` (T5 [B, 512, 4096] + CLIP pooled [B, 768]) plus one random RGB input image."""
    image = random_images(IMAGE_SIZE, IMAGE_SIZE, 1, generator)[0]
    return {**flux_prompt_inputs(pipe, size, batch, device, dtype, generator), "image": image}


VAE_TINY = {
    # tests/pipelines/flux/test_pipeline_flux_kontext.py's tiny AutoencoderKL, 6 blocks deep (vae_scale_factor 32),
    # with the widths growing once as the checkpoint's do (128 -> 256): the encoder's resnet that changes width takes
    # the `conv_shortcut` path (resnet.py L369-373 in 0.37.1), which the input image's encoding runs at full size
    "sample_size": 32, "block_out_channels": [4, 8, 8, 8, 8, 8], "down_block_types": ["DownEncoderBlock2D"] * 6,
    "up_block_types": ["UpDecoderBlock2D"] * 6, "layers_per_block": 1, "latent_channels": 1, "norm_num_groups": 1,
    "use_quant_conv": False, "use_post_quant_conv": False, "shift_factor": 0.0609, "scaling_factor": 1.5035,
}

SCENARIO = dataclasses.replace(
    FLUX,
    name="flux_kontext",
    pipeline_cls="diffusers.FluxKontextPipeline",
    checkpoint="black-forest-labs/FLUX.1-Kontext-dev",
    description="FluxKontextPipeline, 1024x1024 output, 1024x1024 input image, guidance_scale 2.5 (embedded)",
    call={"height": 1024, "width": 1024, "guidance_scale": 2.5, "max_area": 1024 * 1024},
    tiny_call={"height": 128, "width": 128, "max_area": 128 * 128},
    models={
        "transformer": FLUX.models["transformer"],
        "vae": dataclasses.replace(FLUX.models["vae"], tiny=VAE_TINY),
    },
    prompt_inputs=prompt_inputs,
    sources={
        **FLUX.sources,
        "transformer": "FLUX.1-dev's (scenarios/flux.py): class defaults + guidance_embeds=True. The Kontext-dev "
                       "transformer/config.json itself could not be read here (no hub access; no public copy found); "
                       "third-party descriptions (knowledge-space.pages.dev/image-generation/FLUX Kontext: 'same 12B "
                       "DiT as FLUX.1-dev, 19 double / 38 single blocks, hidden 3072, 24 heads') agree",
        "vae": "FLUX.1-dev's (scenarios/flux.py); Kontext-dev ships the FLUX VAE (16 latent channels)",
        "scheduler": "FLUX.1-dev's (scenarios/flux.py); the Kontext-dev scheduler_config.json could not be read here "
                     "(unverified; the pipeline reads only base/max seq len and base/max shift, as Flux's)",
        "call": "pipeline_flux_kontext.py docstring example (0.37.1 L64-78): image + prompt, guidance_scale=2.5, "
                "height/width default 128 * vae_scale_factor 8 = 1024, max_area default 1024**2; "
                "diffusers-upstream.md section E: flux-fast's Kontext call is max_sequence_length 512, guidance 2.5 + image",
        "image": "random 1024x1024 RGB (lab.run.scenario.random_images); _auto_resize picks (1024, 1024) from "
                 "PREFERRED_KONTEXT_RESOLUTIONS for a square image: 4096 image tokens at full size",
        "tiny": "tests/pipelines/flux/test_pipeline_flux_kontext.py get_dummy_components (transformer as `flux` tiny, "
                "with guidance_embeds as dev; VAE 6 blocks deep, see the module docstring); the test passes "
                "max_area=h*w as here",
    },
)

"""LTX-2 image-to-video: LTX2ImageToVideoPipeline at 512x768, 121 frames from a first frame, guidance 4.0.

The same components and call as `ltx2`, plus the conditioning image (a random RGB frame of the call's size), which
the pipeline encodes as the first latent frame. In 0.42.1 this pipeline still has no `set_begin_index`.
"""

import dataclasses

from lab.run.scenario import random_images
from scenarios.ltx2 import SCENARIO as LTX2
from scenarios.ltx2 import prompt_inputs as ltx2_prompt_inputs


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    call = SCENARIO.call_for(size)
    (image,) = random_images(call["height"], call["width"], 1, generator)
    return {**ltx2_prompt_inputs(pipe, size, batch, device, dtype, generator), "image": image}


SCENARIO = dataclasses.replace(
    LTX2,
    name="ltx2_i2v",
    pipeline_cls="diffusers.LTX2ImageToVideoPipeline",
    description="LTX2ImageToVideoPipeline, 512x768, 121 frames from one image, guidance_scale 4.0, STG/modality off",
    prompt_inputs=prompt_inputs,
    sources={**LTX2.sources, "image": "random RGB frame of the call's size (the pipeline resizes and VAE-encodes it)"},
)

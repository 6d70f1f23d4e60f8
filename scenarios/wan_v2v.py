"""Wan2.1 14B video-to-video: WanVideoToVideoPipeline at 480x832, an 81-frame input video, strength 0.8, UniPC.

The same transformer, VAE and scheduler as `wan`; the pipeline encodes the input video and starts the schedule
part-way (strength 0.8 of 4 steps: 3 steps from index 1), so its begin index is not 0.
"""

import dataclasses

from lab.run.scenario import random_images
from scenarios.wan import SCENARIO as WAN
from scenarios.wan import prompt_inputs as wan_prompt_inputs

FRAMES = {"full": 81, "tiny": 9}


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    """The text embeddings of `wan` plus the input video: random RGB frames of the call's height and width."""
    call = SCENARIO.call_for(size)
    video = random_images(call["height"], call["width"], FRAMES[size], generator)
    return {**wan_prompt_inputs(pipe, size, batch, device, dtype, generator), "video": video}


SCENARIO = dataclasses.replace(
    WAN,
    name="wan_v2v",
    pipeline_cls="diffusers.WanVideoToVideoPipeline",
    description="WanVideoToVideoPipeline (Wan2.1 14B), 480x832, 81-frame input video, strength 0.8, guidance 5.0, UniPC",
    call={"height": 480, "width": 832, "guidance_scale": 5.0, "strength": 0.8},
    tiny_call={"height": 16, "width": 16},
    prompt_inputs=prompt_inputs,
    sources={**WAN.sources,
             "call": "pipeline_wan_video2video.py docstring example: UniPC flow_shift 3.0 at 480P, strength 0.8 default"},
)

"""Qwen-Image with `zero_cond_t=True` (the Qwen-Image-Edit-2511 setting): the only one that builds `modulate_index`."""

import dataclasses

from lab.run.scenario import Model
from scenarios.qwenimage import SCENARIO as QWENIMAGE

SCENARIO = dataclasses.replace(
    QWENIMAGE,
    name="qwenimage_zero_cond",
    checkpoint="Qwen/Qwen-Image (transformer with zero_cond_t=True, as Qwen-Image-Edit-2511)",
    description="QwenImagePipeline with a zero_cond_t=True transformer (Edit-2511 setting), 1024x1024, true CFG 4.0",
    models={
        **QWENIMAGE.models,
        "transformer": Model(
            cls="diffusers.QwenImageTransformer2DModel",
            full={"zero_cond_t": True},
            tiny={**QWENIMAGE.models["transformer"].tiny, "zero_cond_t": True},
            blocks=("num_layers",),
        ),
    },
    sources={**QWENIMAGE.sources, "zero_cond_t": "diffusers-upstream.md section A fix 6: Edit-2511 configs set it"},
)

"""Wan2.2 T2V A14B: WanPipeline at 720x1280, 81 frames, guidance 4.0 / guidance_scale_2 3.0 with a negative prompt.

Two 14B transformers of the Wan2.1 T2V 14B config: `transformer` (the high-noise expert) runs the steps whose
timestep is at or above `boundary_ratio` x 1000 = 875, `transformer_2` (the low-noise expert) the rest, each with
its own guidance scale. `boundary_ratio` is a pipeline constructor argument (`WanPipeline.__init__` registers it in
the pipeline config, as the checkpoint's model_index.json holds it), so it goes in `pipeline_kwargs`. The VAE is the
Wan2.1 one in fp32, the scheduler UniPC in flow mode with flow_shift 3.0; with the lab's 4 steps the shifted
timesteps are 1000, 900 (transformer) and 750, 500 (transformer_2), so both experts run.
"""

import dataclasses

from scenarios.wan import SCENARIO as WAN

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
CONVERTER = f"{DIFFUSERS}/scripts/convert_wan_to_diffusers.py"
TEST = f"{DIFFUSERS}/tests/pipelines/wan/test_wan_22.py"
PIPELINE = "diffusers 0.37.1 pipelines/wan/pipeline_wan.py"
CARD = "https://huggingface.co/Wan-AI/Wan2.2-T2V-A14B-Diffusers"

#: both experts have the Wan2.1 T2V 14B config (WanTransformer3DModel's class defaults) and the same tiny config
#: as the upstream test; `--layers N` caps `num_layers` of each
TRANSFORMER = WAN.models["transformer"]

SCENARIO = dataclasses.replace(
    WAN,
    name="wan22",
    pipeline_cls="diffusers.WanPipeline",
    checkpoint="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
    description="WanPipeline (Wan2.2 T2V A14B, two 14B experts, boundary 0.875), 720x1280, 81 frames, "
                "guidance 4.0 / 3.0 + negative prompt, UniPC",
    call={"height": 720, "width": 1280, "num_frames": 81, "guidance_scale": 4.0, "guidance_scale_2": 3.0},
    tiny_call={"height": 16, "width": 16, "num_frames": 9},
    models={"transformer": TRANSFORMER, "transformer_2": TRANSFORMER, "vae": WAN.models["vae"]},
    scheduler=(
        "diffusers.UniPCMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "num_train_timesteps": 1000, "flow_shift": 3.0},
    ),
    # the checkpoint's model_index.json value; at tiny size too (the upstream test uses 0.875)
    pipeline_kwargs={"boundary_ratio": 0.875},
    sources={
        "transformer/transformer_2": f"{CONVERTER} L529-548 get_transformer_config('Wan2.2-T2V-A14B') (= the "
                                     "Wan-T2V-14B config L350-368 = WanTransformer3DModel defaults); L1171-1173: "
                                     "transformer = high_noise_model, transformer_2 = low_noise_model",
        "vae": f"{CONVERTER} L1178-1181 and L646/L844: convert_vae() = AutoencoderKLWan() defaults (the Wan2.1 VAE); "
               "fp32 as the docs load it",
        "scheduler": f"{CONVERTER} L1185-1193: UniPC flow_prediction, use_flow_sigmas, flow_shift 3.0 for T2V A14B "
                     "(the hub scheduler_config.json itself not seen; a third-party config of this checkpoint also "
                     "gives 3.0)",
        "boundary_ratio": f"{CONVERTER} L1212-1221: WanPipeline(..., boundary_ratio=0.875); {PIPELINE} L137-153 "
                          "(constructor argument, register_to_config) and L577-596 (the switch); a third-party copy "
                          "of the checkpoint's model_index.json also reads boundary_ratio 0.875",
        "call": f"{CARD} model card example (720x1280, 81 frames, guidance_scale 4.0, guidance_scale_2 3.0, 40 steps, "
                "Chinese default negative prompt), seen only through several public copies of it; the card itself "
                "and docs/source/en/api/pipelines/wan.md (no Wan2.2 T2V call example) were not seen",
        "prompt_embeds": "UMT5-XXL [B, 512, 4096] + negative of the same shape, as scenarios/wan.py",
        "tiny": f"{TEST} L37-96 get_dummy_components (two identical tiny transformers, boundary_ratio 0.875) and "
                "L97-110 get_dummy_inputs (16x16, 9 frames); UniPC flow_shift 3.0 as the test",
    },
)

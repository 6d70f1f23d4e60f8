# diffusers: tests/pipelines/aura_flow/test_pipeline_aura_flow_timestep_device.py
import unittest
from unittest import mock

import torch

from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, AutoencoderKL, FlowMatchEulerDiscreteScheduler


class AuraFlowTimestepOnDeviceTests(unittest.TestCase):
    """The denoising loop keeps the step's timestep where the scheduler put it.

    `torch.tensor([t / 1000])` reads the value of the timestep `t` to the host (a device-to-host sync on an
    accelerator) and the next line copies it back. The loop divides `t` where it is instead, so no tensor is built from
    another tensor's value in any step.
    """

    def get_dummy_components(self):
        torch.manual_seed(0)
        transformer = AuraFlowTransformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=4,
            num_mmdit_layers=1,
            num_single_dit_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=32,
            out_channels=4,
            pos_embed_max_size=256,
        )

        torch.manual_seed(0)
        vae = AutoencoderKL(
            block_out_channels=[32, 64],
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
            latent_channels=4,
            sample_size=32,
        )

        return {
            "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": None,
            "tokenizer": None,
            "transformer": transformer,
            "vae": vae,
        }

    def get_dummy_inputs(self, num_inference_steps):
        generator = torch.Generator(device="cpu").manual_seed(0)
        prompt_embeds = torch.randn((1, 8, 32), generator=generator)
        return {
            "prompt_embeds": prompt_embeds,
            "prompt_attention_mask": torch.ones((1, 8), dtype=torch.long),
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": 1.0,
            "height": 32,
            "width": 32,
            "output_type": "latent",
        }

    def _tensors_built_from_tensors(self, pipe, num_inference_steps):
        inputs = self.get_dummy_inputs(num_inference_steps)
        with mock.patch.object(torch, "tensor", wraps=torch.tensor) as tensor:
            pipe(**inputs)
        return sum(
            1
            for call in tensor.call_args_list
            if call.args and isinstance(call.args[0], (list, tuple)) and any(torch.is_tensor(x) for x in call.args[0])
        )

    def test_timestep_not_read_to_host_per_step(self):
        pipe = AuraFlowPipeline(**self.get_dummy_components())
        pipe.set_progress_bar_config(disable=True)

        two_steps = self._tensors_built_from_tensors(pipe, 2)
        four_steps = self._tensors_built_from_tensors(pipe, 4)
        self.assertEqual(two_steps, four_steps, "a tensor is built from a tensor's value in every denoising step")

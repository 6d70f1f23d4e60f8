# diffusers: tests/pipelines/flux2/test_pipeline_flux2_unpack_hw.py
import unittest
from unittest import mock

import torch

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinInpaintPipeline,
    Flux2KleinKVPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
)

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class Flux2UnpackWithKnownSizeTests(unittest.TestCase):
    """The Flux 2 pipelines unpack the latents with the latent height and width they know.

    `_unpack_latents_with_ids` finds the grid's size as `torch.max(ids) + 1`, a device tensor that sizes a new tensor
    and a view: a device-to-host sync per sample. The pipelines pass the size they computed from `height` and `width`.
    """

    def get_dummy_components(self):
        torch.manual_seed(0)
        transformer = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=16,
            timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4],
        )
        torch.manual_seed(0)
        vae = AutoencoderKLFlux2(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",),
            up_block_types=("UpDecoderBlock2D",),
            block_out_channels=(4,),
            layers_per_block=1,
            latent_channels=1,
            norm_num_groups=1,
            use_quant_conv=False,
            use_post_quant_conv=False,
        )
        return {
            "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": None,
            "tokenizer": None,
            "transformer": transformer,
            "vae": vae,
        }

    def get_dummy_inputs(self):
        generator = torch.Generator(device="cpu").manual_seed(0)
        return {
            "prompt_embeds": torch.randn((1, 8, 16), generator=generator).to(torch_device),
            "generator": generator,
            "num_inference_steps": 2,
            "guidance_scale": 5.0,
            "height": 8,
            "width": 8,
            "output_type": "pt",
        }

    def test_pipeline_does_not_read_the_size_from_the_ids(self):
        pipe = Flux2Pipeline(**self.get_dummy_components()).to(torch_device)
        pipe.set_progress_bar_config(disable=True)
        with mock.patch.object(torch, "max", wraps=torch.max) as maximum:
            image = pipe(**self.get_dummy_inputs()).images
        self.assertEqual(image.shape, (1, 3, 8, 8))
        self.assertEqual(maximum.call_count, 0, "the latent size is read from the position ids")

    def test_unpack_with_the_size_given(self):
        latents = torch.randn(2, 4, 3, 5, generator=torch.Generator("cpu").manual_seed(0))
        ids = Flux2Pipeline._prepare_latent_ids(latents)
        packed = latents.flatten(2).transpose(1, 2)
        for pipeline_class in (Flux2Pipeline, Flux2KleinInpaintPipeline, Flux2KleinKVPipeline):
            with self.subTest(pipeline=pipeline_class.__name__):
                with mock.patch.object(torch, "max", wraps=torch.max) as maximum:
                    unpacked = pipeline_class._unpack_latents_with_ids(packed, ids, 3, 5)
                self.assertEqual(maximum.call_count, 0)
                torch.testing.assert_close(unpacked, latents, rtol=0, atol=0)
                torch.testing.assert_close(pipeline_class._unpack_latents_with_ids(packed, ids), latents)

# diffusers: tests/pipelines/test_pipelines_transformer_dtype_once.py
import unittest
from unittest import mock

import torch

from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    ZImageImg2ImgPipeline,
    ZImagePipeline,
    ZImageTransformer2DModel,
)

from ..testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class TransformerDtypeOnceTests(unittest.TestCase):
    """The Flux 2 and Z-Image pipelines read the transformer's dtype once, before the denoising loop.

    `ModelMixin.dtype` walks the model's parameters and buffers to find the first floating-point one: a host cost that
    grows with the model (and with the hooks of offloading and caching on its submodules), paid in every step.
    """

    def dtype_reads(self, pipe, inputs):
        transformer = pipe.transformer
        dtype = type(transformer).dtype
        with mock.patch.object(
            type(transformer), "dtype", new_callable=mock.PropertyMock, side_effect=lambda: dtype.fget(transformer)
        ) as read:
            pipe(**inputs)
        return read.call_count

    def assert_reads_do_not_grow_with_the_steps(self, pipe, get_inputs):
        pipe.set_progress_bar_config(disable=True)
        self.assertEqual(
            self.dtype_reads(pipe, get_inputs(2)),
            self.dtype_reads(pipe, get_inputs(4)),
            "the transformer's dtype is read in every denoising step",
        )

    def get_flux2_components(self, guidance_embeds):
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
            guidance_embeds=guidance_embeds,
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

    def get_flux2_inputs(self, num_inference_steps, guidance_scale):
        generator = torch.Generator(device="cpu").manual_seed(0)
        return {
            "prompt_embeds": torch.randn((1, 8, 16), generator=generator).to(torch_device),
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "height": 8,
            "width": 8,
            "output_type": "latent",
        }

    def test_flux2(self):
        pipe = Flux2Pipeline(**self.get_flux2_components(guidance_embeds=True)).to(torch_device)
        self.assert_reads_do_not_grow_with_the_steps(pipe, lambda steps: self.get_flux2_inputs(steps, 5.0))

    def test_flux2_klein(self):
        components = self.get_flux2_components(guidance_embeds=False)
        pipe = Flux2KleinPipeline(**components, is_distilled=True).to(torch_device)
        self.assert_reads_do_not_grow_with_the_steps(pipe, lambda steps: self.get_flux2_inputs(steps, 1.0))

    def get_z_image_components(self):
        torch.manual_seed(0)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=16,
            dim=32,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=2,
            n_kv_heads=2,
            norm_eps=1e-5,
            qk_norm=True,
            cap_feat_dim=16,
            rope_theta=256.0,
            t_scale=1000.0,
            axes_dims=[8, 4, 4],
            axes_lens=[256, 32, 32],
        )
        with torch.no_grad():
            transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token.data))
            transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token.data))
        torch.manual_seed(0)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
            block_out_channels=[32, 64],
            layers_per_block=1,
            latent_channels=16,
            norm_num_groups=32,
            sample_size=32,
            scaling_factor=0.3611,
            shift_factor=0.1159,
        )
        return {
            "transformer": transformer,
            "vae": vae,
            "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": None,
            "tokenizer": None,
        }

    def get_z_image_inputs(self, num_inference_steps, image=False):
        generator = torch.Generator(device="cpu").manual_seed(0)
        inputs = {
            "prompt_embeds": [torch.randn((8, 16), generator=generator).to(torch_device)],
            "negative_prompt_embeds": [torch.randn((8, 16), generator=generator).to(torch_device)],
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": 3.0,
            "cfg_normalization": False,
            "cfg_truncation": 1.0,
            "height": 32,
            "width": 32,
            "output_type": "latent",
        }
        if image:
            inputs["image"] = torch.rand((1, 3, 32, 32), generator=generator).to(torch_device)
            inputs["strength"] = 1.0
        return inputs

    def test_z_image(self):
        pipe = ZImagePipeline(**self.get_z_image_components()).to(torch_device)
        self.assert_reads_do_not_grow_with_the_steps(pipe, self.get_z_image_inputs)

    def test_z_image_img2img(self):
        pipe = ZImageImg2ImgPipeline(**self.get_z_image_components()).to(torch_device)
        self.assert_reads_do_not_grow_with_the_steps(pipe, lambda steps: self.get_z_image_inputs(steps, image=True))

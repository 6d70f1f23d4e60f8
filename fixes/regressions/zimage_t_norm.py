# diffusers: tests/pipelines/z_image/test_z_image_t_norm_once.py
import contextlib
import unittest
from unittest import mock

import torch

from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    ZImageImg2ImgPipeline,
    ZImageInpaintPipeline,
    ZImageTransformer2DModel,
)

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


@contextlib.contextmanager
def count_host_reads():
    """Counts reads of a tensor's value on the host (a device-to-host sync on an accelerator): `.item()`, `.tolist()`
    and a tensor used as a bool."""
    counts = {"reads": 0}

    def counted(original):
        def read(self, *args, **kwargs):
            counts["reads"] += 1
            return original(self, *args, **kwargs)

        return read

    with contextlib.ExitStack() as stack:
        for name in ("item", "tolist", "__bool__"):
            stack.enter_context(mock.patch.object(torch.Tensor, name, counted(getattr(torch.Tensor, name))))
        yield counts


class ZImageTimestepNormOnceTests(unittest.TestCase):
    """The Z-Image pipelines read the normalized timesteps for CFG truncation once, before the denoising loop.

    `timestep[0].item()` in every step is a device-to-host sync, and without classifier-free guidance nothing uses
    it. The pipelines read all of them with one `.tolist()` before the loop, and none without guidance.
    """

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

    def get_z_image_inputs(self, num_inference_steps, guidance_scale, mask=False):
        generator = torch.Generator(device="cpu").manual_seed(0)
        inputs = {
            "prompt_embeds": [torch.randn((8, 16), generator=generator).to(torch_device)],
            "negative_prompt_embeds": [torch.randn((8, 16), generator=generator).to(torch_device)],
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "cfg_normalization": False,
            "cfg_truncation": 1.0,
            "height": 32,
            "width": 32,
            "output_type": "latent",
        }
        inputs["image"] = torch.rand((1, 3, 32, 32), generator=generator).to(torch_device)
        inputs["strength"] = 1.0
        if mask:
            inputs["mask_image"] = torch.ones((1, 1, 32, 32)).to(torch_device)
        return inputs

    def reads(self, pipe, inputs):
        with count_host_reads() as counts:
            pipe(**inputs)
        return counts["reads"]

    def test_reads_do_not_grow_with_the_steps(self):
        for pipeline_class in (ZImageImg2ImgPipeline, ZImageInpaintPipeline):
            for guidance_scale in (0.0, 3.0):
                with self.subTest(pipeline=pipeline_class.__name__, guidance_scale=guidance_scale):
                    pipe = pipeline_class(**self.get_z_image_components()).to(torch_device)
                    pipe.set_progress_bar_config(disable=True)
                    mask = pipeline_class is ZImageInpaintPipeline
                    self.assertEqual(
                        self.reads(pipe, self.get_z_image_inputs(2, guidance_scale, mask)),
                        self.reads(pipe, self.get_z_image_inputs(4, guidance_scale, mask)),
                        "the normalized timestep is read to the host in every denoising step",
                    )

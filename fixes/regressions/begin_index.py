# diffusers: tests/pipelines/test_pipelines_scheduler_begin_index.py
import unittest
from unittest import mock

import numpy as np
import torch
from PIL import Image

from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    AutoencoderKLLTXVideo,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    LTXPipeline,
    LTXVideoTransformer3DModel,
    SanaPipeline,
    SanaTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    UniPCMultistepScheduler,
    WanTransformer3DModel,
    WanVideoToVideoPipeline,
)


class SchedulerBeginIndexTests(unittest.TestCase):
    """Pipelines set the scheduler's begin index before the denoising loop.

    Without it, the scheduler's first `step()` (and `add_noise`/`scale_noise` of an image-to-X pipeline) finds the
    index of `t` with `(timesteps == t).nonzero().item()`: a device-to-host sync per call, and a graph break under
    `torch.compile`. With `strength`, the begin index is the number of timesteps the pipeline skips.
    """

    def _run_without_timestep_lookup(self, pipe, inputs):
        with mock.patch.object(
            pipe.scheduler, "index_for_timestep", wraps=pipe.scheduler.index_for_timestep
        ) as index_for_timestep:
            output = pipe(**inputs)[0]
        self.assertEqual(
            index_for_timestep.call_count, 0, "the scheduler looks the timestep up: the begin index is not set"
        )
        return output

    def _run_with_timestep_lookup(self, pipe, inputs):
        # what the scheduler does without a begin index: the index found by looking the timestep up
        with mock.patch.object(pipe.scheduler, "set_begin_index"):
            return pipe(**inputs)[0]

    def test_stable_diffusion_3(self):
        torch.manual_seed(0)
        transformer = SD3Transformer2DModel(
            sample_size=32,
            patch_size=1,
            in_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=32,
            pooled_projection_dim=64,
            out_channels=4,
        )
        torch.manual_seed(0)
        vae = AutoencoderKL(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            block_out_channels=(4,),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=1,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        )
        pipe = StableDiffusion3Pipeline(
            transformer=transformer,
            vae=vae,
            scheduler=FlowMatchEulerDiscreteScheduler(),
            text_encoder=None,
            tokenizer=None,
            text_encoder_2=None,
            tokenizer_2=None,
            text_encoder_3=None,
            tokenizer_3=None,
        )
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator(device="cpu").manual_seed(0)
        inputs = {
            "prompt_embeds": torch.randn((1, 8, 32), generator=generator),
            "pooled_prompt_embeds": torch.randn((1, 64), generator=generator),
            "num_inference_steps": 2,
            "guidance_scale": 1.0,
            "height": 32,
            "width": 32,
            "output_type": "latent",
        }
        self._run_without_timestep_lookup(pipe, inputs)

    def test_sana(self):
        torch.manual_seed(0)
        transformer = SanaTransformer2DModel(
            patch_size=1,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            num_attention_heads=2,
            attention_head_dim=4,
            num_cross_attention_heads=2,
            cross_attention_head_dim=4,
            cross_attention_dim=8,
            caption_channels=8,
            sample_size=32,
        )
        torch.manual_seed(0)
        vae = AutoencoderDC(
            in_channels=3,
            latent_channels=4,
            attention_head_dim=2,
            encoder_block_types=("ResBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "EfficientViTBlock"),
            encoder_block_out_channels=(8, 8),
            decoder_block_out_channels=(8, 8),
            encoder_qkv_multiscales=((), (5,)),
            decoder_qkv_multiscales=((), (5,)),
            encoder_layers_per_block=(1, 1),
            decoder_layers_per_block=[1, 1],
            downsample_block_type="conv",
            upsample_block_type="interpolate",
            decoder_norm_types="rms_norm",
            decoder_act_fns="silu",
            scaling_factor=0.41407,
        )
        pipe = SanaPipeline(
            transformer=transformer,
            vae=vae,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
            text_encoder=None,
            tokenizer=None,
        )
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator(device="cpu").manual_seed(0)
        inputs = {
            "prompt_embeds": torch.randn((1, 8, 8), generator=generator),
            "prompt_attention_mask": torch.ones((1, 8), dtype=torch.long),
            "num_inference_steps": 2,
            "guidance_scale": 1.0,
            "height": 32,
            "width": 32,
            "output_type": "latent",
            "complex_human_instruction": None,
        }
        self._run_without_timestep_lookup(pipe, inputs)

    def test_ltx(self):
        torch.manual_seed(0)
        transformer = LTXVideoTransformer3DModel(
            in_channels=8,
            out_channels=8,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=4,
            attention_head_dim=8,
            cross_attention_dim=32,
            num_layers=1,
            caption_channels=32,
        )
        torch.manual_seed(0)
        vae = AutoencoderKLLTXVideo(
            in_channels=3,
            out_channels=3,
            latent_channels=8,
            block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, False, False),
            decoder_spatio_temporal_scaling=(True, True, False, False),
            decoder_inject_noise=(False, False, False, False, False),
            upsample_residual=(False, False, False, False),
            upsample_factor=(1, 1, 1, 1),
            timestep_conditioning=False,
            patch_size=1,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        )
        pipe = LTXPipeline(
            transformer=transformer,
            vae=vae,
            scheduler=FlowMatchEulerDiscreteScheduler(),
            text_encoder=None,
            tokenizer=None,
        )
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator(device="cpu").manual_seed(0)
        inputs = {
            "prompt_embeds": torch.randn((1, 8, 32), generator=generator),
            "prompt_attention_mask": torch.ones((1, 8), dtype=torch.long),
            "num_inference_steps": 2,
            "guidance_scale": 1.0,
            "height": 32,
            "width": 32,
            "num_frames": 9,
            "output_type": "latent",
        }
        self._run_without_timestep_lookup(pipe, inputs)

    def test_wan_video_to_video_begins_where_strength_starts(self):
        torch.manual_seed(0)
        vae = AutoencoderKLWan(
            base_dim=3,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        )
        torch.manual_seed(0)
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=16,
            out_channels=16,
            text_dim=32,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )
        pipe = WanVideoToVideoPipeline(
            transformer=transformer,
            vae=vae,
            scheduler=UniPCMultistepScheduler(flow_shift=3.0),
            text_encoder=None,
            tokenizer=None,
        )
        pipe.set_progress_bar_config(disable=True)
        prompt_embeds = torch.randn((1, 16, 32), generator=torch.Generator(device="cpu").manual_seed(0))

        def inputs():
            return {
                "video": [Image.new("RGB", (16, 16))] * 17,
                "prompt_embeds": prompt_embeds,
                "generator": torch.Generator(device="cpu").manual_seed(0),
                "num_inference_steps": 4,
                "strength": 0.5,
                "guidance_scale": 1.0,
                "height": 16,
                "width": 16,
                "output_type": "latent",
            }

        with_begin_index = self._run_without_timestep_lookup(pipe, inputs())
        looked_up = self._run_with_timestep_lookup(pipe, inputs())
        # the begin index is the one the lookup finds: the same noise level, the same output
        np.testing.assert_allclose(with_begin_index.numpy(), looked_up.numpy(), rtol=0, atol=0)

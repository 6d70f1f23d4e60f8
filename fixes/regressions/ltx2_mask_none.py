# diffusers: tests/pipelines/ltx2/test_ltx2_connector_registers_mask.py
import unittest

import torch

from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    FlowMatchEulerDiscreteScheduler,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.connectors import LTX2ConnectorTransformer1d
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

from ...testing_utils import enable_full_determinism


enable_full_determinism()


class LTX2ConnectorRegistersMaskTests(unittest.TestCase):
    """With learnable registers the connector fills every padding position, so its attention mask is all zeros and
    the text mask it returns is all ones: a mask that masks nothing. Passing it anyway makes every attention take the
    masked (slower) kernel, so the connector's blocks and the transformer's text cross-attention must get
    `attention_mask=None` there, and the mask as before without registers.
    """

    caption_channels = 32
    text_proj_in_factor = 3
    num_registers = 8
    seq_len = 16

    def get_connector(self, num_registers):
        torch.manual_seed(0)
        return LTX2ConnectorTransformer1d(
            num_attention_heads=4,
            attention_head_dim=8,
            num_layers=2,
            num_learnable_registers=num_registers,
            rope_base_seq_len=32,
            rope_double_precision=False,
            rope_type="split",
        ).eval()

    def get_dummy_components(self, num_registers):
        torch.manual_seed(0)
        transformer = LTX2VideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            audio_in_channels=4,
            audio_out_channels=4,
            audio_num_attention_heads=2,
            audio_attention_head_dim=4,
            audio_cross_attention_dim=8,
            num_layers=2,
            qk_norm="rms_norm_across_heads",
            caption_channels=self.caption_channels,
            rope_double_precision=False,
            rope_type="split",
        )

        torch.manual_seed(0)
        connectors = LTX2TextConnectors(
            caption_channels=self.caption_channels,
            text_proj_in_factor=self.text_proj_in_factor,
            video_connector_num_attention_heads=4,
            video_connector_attention_head_dim=8,
            video_connector_num_layers=1,
            video_connector_num_learnable_registers=num_registers,
            audio_connector_num_attention_heads=4,
            audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=num_registers,
            connector_rope_base_seq_len=32,
            rope_theta=10000.0,
            rope_double_precision=False,
            causal_temporal_positioning=False,
            rope_type="split",
        )

        torch.manual_seed(0)
        vae = AutoencoderKLLTX2Video(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            block_out_channels=(8,),
            decoder_block_out_channels=(8,),
            layers_per_block=(1,),
            decoder_layers_per_block=(1, 1),
            spatio_temporal_scaling=(True,),
            decoder_spatio_temporal_scaling=(True,),
            decoder_inject_noise=(False, False),
            downsample_type=("spatial",),
            upsample_residual=(False,),
            upsample_factor=(1,),
            timestep_conditioning=False,
            patch_size=1,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        )

        torch.manual_seed(0)
        audio_vae = AutoencoderKLLTX2Audio(
            base_channels=4,
            output_channels=2,
            ch_mult=(1,),
            num_res_blocks=1,
            attn_resolutions=None,
            in_channels=2,
            resolution=32,
            latent_channels=2,
            norm_type="pixel",
            causality_axis="height",
            dropout=0.0,
            mid_block_add_attention=False,
            sample_rate=16000,
            mel_hop_length=160,
            is_causal=True,
            mel_bins=8,
        )

        torch.manual_seed(0)
        vocoder = LTX2Vocoder(
            in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
            hidden_channels=32,
            out_channels=2,
            upsample_kernel_sizes=[4, 4],
            upsample_factors=[2, 2],
            resnet_kernel_sizes=[3],
            resnet_dilations=[[1, 3, 5]],
            leaky_relu_negative_slope=0.1,
            output_sampling_rate=16000,
        )

        return {
            "transformer": transformer,
            "vae": vae,
            "audio_vae": audio_vae,
            "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": None,
            "tokenizer": None,
            "connectors": connectors,
            "vocoder": vocoder,
        }

    def get_dummy_inputs(self, guidance_scale, stg_scale):
        generator = torch.Generator(device="cpu").manual_seed(0)
        prompt_embeds = torch.randn(
            1, self.seq_len, self.caption_channels * self.text_proj_in_factor, generator=generator
        )
        negative_prompt_embeds = torch.randn(prompt_embeds.shape, generator=generator)
        # left padding, as the Gemma tokenizer of the LTX-2 pipelines pads
        prompt_attention_mask = torch.zeros(1, self.seq_len, dtype=torch.int64)
        prompt_attention_mask[:, -5:] = 1
        negative_prompt_attention_mask = torch.zeros(1, self.seq_len, dtype=torch.int64)
        negative_prompt_attention_mask[:, -1:] = 1
        return {
            "prompt_embeds": prompt_embeds,
            "prompt_attention_mask": prompt_attention_mask,
            "negative_prompt_embeds": negative_prompt_embeds,
            "negative_prompt_attention_mask": negative_prompt_attention_mask,
            "generator": generator,
            "num_inference_steps": 2,
            "guidance_scale": guidance_scale,
            "stg_scale": stg_scale,
            "modality_scale": 1.0,
            "guidance_rescale": 0.0,
            "audio_guidance_scale": guidance_scale,
            "audio_stg_scale": stg_scale,
            "audio_modality_scale": 1.0,
            "audio_guidance_rescale": 0.0,
            "spatio_temporal_guidance_blocks": [1],
            "use_cross_timestep": False,
            "height": 32,
            "width": 32,
            "num_frames": 5,
            "frame_rate": 25.0,
            "output_type": "latent",
        }

    def connector_block_masks(self, num_registers):
        connector = self.get_connector(num_registers)
        masks = []
        for block in connector.transformer_blocks:
            block.register_forward_pre_hook(
                lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True
            )
        hidden_states = torch.randn(2, self.seq_len, 32)
        binary_mask = torch.zeros(2, self.seq_len)
        binary_mask[0, -5:] = 1
        binary_mask[1, -1:] = 1
        additive_mask = ((binary_mask - 1) * torch.finfo(torch.float32).max).reshape(2, 1, 1, self.seq_len)
        with torch.no_grad():
            connector(hidden_states, additive_mask)
        self.assertEqual(len(masks), len(connector.transformer_blocks))
        return masks

    def transformer_text_masks(self, num_registers, guidance_scale=1.0, stg_scale=0.0):
        pipe = LTX2Pipeline(**self.get_dummy_components(num_registers))
        pipe.set_progress_bar_config(disable=True)
        masks = []

        def record(module, args, kwargs):
            masks.append(kwargs["encoder_attention_mask"])
            masks.append(kwargs["audio_encoder_attention_mask"])

        pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
        with torch.no_grad():
            pipe(**self.get_dummy_inputs(guidance_scale, stg_scale))
        self.assertGreater(len(masks), 0)
        return masks

    def test_connector_blocks_get_no_mask_with_registers(self):
        masks = self.connector_block_masks(self.num_registers)
        self.assertTrue(all(mask is None for mask in masks))

    def test_connector_blocks_keep_mask_without_registers(self):
        masks = self.connector_block_masks(None)
        self.assertTrue(all(mask is not None for mask in masks))

    def test_transformer_gets_no_text_mask_with_registers(self):
        for guidance_scale in (1.0, 4.0):
            with self.subTest(guidance_scale=guidance_scale):
                masks = self.transformer_text_masks(self.num_registers, guidance_scale=guidance_scale)
                self.assertTrue(all(mask is None for mask in masks))

    def test_transformer_gets_no_text_mask_with_registers_and_stg(self):
        # classifier-free and spatio-temporal guidance together (the pipeline's defaults) split the text mask once
        masks = self.transformer_text_masks(self.num_registers, guidance_scale=4.0, stg_scale=1.0)
        self.assertTrue(all(mask is None for mask in masks))

    def test_transformer_keeps_text_mask_without_registers(self):
        masks = self.transformer_text_masks(None, guidance_scale=4.0, stg_scale=1.0)
        self.assertTrue(all(mask is not None for mask in masks))

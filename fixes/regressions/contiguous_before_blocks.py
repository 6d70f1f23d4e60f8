# diffusers: tests/models/transformers/test_models_transformer_contiguous_before_blocks.py
import unittest

import torch

from diffusers import CogVideoXTransformer3DModel, HunyuanVideoTransformer3DModel, SanaTransformer2DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class ContiguousBeforeBlocksTests(unittest.TestCase):
    """The activations reach the transformer blocks contiguous.

    A patch embedding that ends in `flatten(2).transpose(1, 2)` (Sana, HunyuanVideo) and CogVideoX's split of the
    joint sequence into text and video slices give strided views: every norm, linear and elementwise kernel of every
    block then copies or strides. Making them contiguous once before the block loop does that copy once.
    """

    def first_block_inputs(self, model, blocks, inputs, names):
        seen = {}

        def record(module, args, kwargs):
            for i, name in enumerate(names):
                seen[name] = kwargs[name] if name in kwargs else args[i]

        handle = blocks[0].register_forward_pre_hook(record, with_kwargs=True)
        with torch.no_grad():
            model(**inputs)
        handle.remove()
        self.assertEqual(sorted(seen), sorted(names))
        return seen

    def assert_contiguous(self, tensors):
        for name, tensor in tensors.items():
            self.assertTrue(tensor.is_contiguous(), f"{name} reaches the first block as a strided view")

    def test_sana(self):
        torch.manual_seed(0)
        model = SanaTransformer2DModel(
            patch_size=1,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=4,
            num_attention_heads=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=4,
            cross_attention_dim=8,
            caption_channels=8,
            sample_size=32,
        ).to(torch_device)
        generator = torch.Generator("cpu").manual_seed(0)
        inputs = {
            "hidden_states": torch.randn((2, 4, 32, 32), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((2, 8, 8), generator=generator).to(torch_device),
            "timestep": torch.randint(0, 1000, size=(2,), generator=generator).to(torch_device),
        }
        seen = self.first_block_inputs(model, model.transformer_blocks, inputs, ["hidden_states"])
        self.assert_contiguous(seen)

    def test_hunyuan_video(self):
        torch.manual_seed(0)
        model = HunyuanVideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
            image_condition_type=None,
        ).to(torch_device)
        generator = torch.Generator("cpu").manual_seed(0)
        inputs = {
            "hidden_states": torch.randn((1, 4, 1, 16, 16), generator=generator).to(torch_device),
            "timestep": torch.randint(0, 1000, size=(1,), generator=generator).to(torch_device, torch.float32),
            "encoder_hidden_states": torch.randn((1, 12, 16), generator=generator).to(torch_device),
            "pooled_projections": torch.randn((1, 8), generator=generator).to(torch_device),
            "encoder_attention_mask": torch.ones((1, 12)).to(torch_device),
            "guidance": torch.randint(0, 1000, size=(1,), generator=generator).to(torch_device, torch.float32),
        }
        seen = self.first_block_inputs(model, model.transformer_blocks, inputs, ["hidden_states"])
        self.assert_contiguous(seen)

    def test_cogvideox(self):
        torch.manual_seed(0)
        model = CogVideoXTransformer3DModel(
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            time_embed_dim=2,
            text_embed_dim=8,
            num_layers=2,
            sample_width=8,
            sample_height=8,
            sample_frames=8,
            patch_size=2,
            patch_size_t=None,
            temporal_compression_ratio=4,
            max_text_seq_length=8,
        ).to(torch_device)
        generator = torch.Generator("cpu").manual_seed(0)
        # a batch of two, as classifier-free guidance runs it: a slice of a batched sequence is a strided view
        inputs = {
            "hidden_states": torch.randn((2, 1, 4, 8, 8), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((2, 8, 8), generator=generator).to(torch_device),
            "timestep": torch.randint(0, 1000, size=(2,), generator=generator).to(torch_device),
        }
        seen = self.first_block_inputs(
            model, model.transformer_blocks, inputs, ["hidden_states", "encoder_hidden_states"]
        )
        self.assert_contiguous(seen)

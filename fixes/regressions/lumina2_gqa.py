# diffusers: tests/models/transformers/test_models_transformer_lumina2_gqa.py
import unittest
from unittest import mock

import torch
import torch.nn.functional as F

from diffusers import Lumina2Transformer2DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class Lumina2GroupedQueryAttentionTests(unittest.TestCase):
    """Lumina 2's attention runs grouped-query attention with `enable_gqa=True`.

    Repeating the keys and values to the query's number of heads (`unsqueeze(3).repeat(...).flatten(2, 3)`) copies
    them in every attention call of every step; `scaled_dot_product_attention(..., enable_gqa=True)` reads the shared
    heads where they are.
    """

    def get_model(self):
        torch.manual_seed(0)
        return Lumina2Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            hidden_size=24,
            num_layers=2,
            num_refiner_layers=1,
            num_attention_heads=3,
            num_kv_heads=1,
            multiple_of=2,
            ffn_dim_multiplier=None,
            norm_eps=1e-5,
            scaling_factor=1.0,
            axes_dim_rope=(4, 2, 2),
            axes_lens=(128, 128, 128),
            cap_feat_dim=32,
        ).to(torch_device)

    def get_dummy_inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        return {
            "hidden_states": torch.randn((2, 4, 16, 16), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((2, 16, 32), generator=generator).to(torch_device),
            "timestep": torch.rand(size=(2,), generator=generator).to(torch_device),
            "encoder_attention_mask": torch.ones((2, 16), dtype=torch.bool, device=torch_device),
        }

    def test_keys_and_values_are_not_repeated(self):
        model = self.get_model()
        with (
            torch.no_grad(),
            mock.patch.object(F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as attention,
        ):
            model(**self.get_dummy_inputs())
        self.assertGreater(attention.call_count, 0)
        for call in attention.call_args_list:
            query, key, value = call.args[:3]
            self.assertEqual(key.shape[1], 1, "the keys are repeated to the query's heads")
            self.assertEqual(value.shape[1], 1, "the values are repeated to the query's heads")
            self.assertEqual(query.shape[1], 3)
            self.assertTrue(call.kwargs.get("enable_gqa"))

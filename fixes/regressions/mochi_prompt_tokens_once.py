# diffusers: tests/models/transformers/test_models_transformer_mochi_prompt_tokens_once.py
import unittest
from unittest import mock

import torch

from diffusers import MochiTransformer3DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class MochiValidPromptTokensOnceTests(unittest.TestCase):
    """Mochi's attention finds each sample's valid prompt tokens once per mask, not in every attention call.

    `torch.nonzero` of the mask waits for the device (a device-to-host sync per sample), and the transformer passes
    the same mask to every block in every step.
    """

    def get_model(self):
        torch.manual_seed(0)
        return MochiTransformer3DModel(
            patch_size=2,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            pooled_projection_dim=16,
            in_channels=4,
            out_channels=None,
            qk_norm="rms_norm",
            text_embed_dim=16,
            time_embed_dim=4,
            activation_fn="swiglu",
            max_sequence_length=16,
        ).to(torch_device)

    def get_dummy_inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        mask = torch.ones((2, 16), dtype=torch.bool)
        mask[1, 12:] = False
        return {
            "hidden_states": torch.randn((2, 4, 2, 16, 16), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((2, 16, 16), generator=generator).to(torch_device),
            "timestep": torch.randint(0, 1000, size=(2,), generator=generator).to(torch_device),
            "encoder_attention_mask": mask.to(torch_device),
        }

    def nonzero_calls(self, forwards):
        model = self.get_model()
        inputs = self.get_dummy_inputs()
        with torch.no_grad(), mock.patch.object(torch, "nonzero", wraps=torch.nonzero) as nonzero:
            outputs = [model(**inputs, return_dict=False)[0] for _ in range(forwards)]
        torch.testing.assert_close(outputs[0], outputs[-1], rtol=0, atol=0)
        return nonzero.call_count

    def test_valid_tokens_found_once_per_mask(self):
        self.assertEqual(
            self.nonzero_calls(1), self.nonzero_calls(3), "the valid prompt tokens are found in every forward"
        )
        self.assertLessEqual(self.nonzero_calls(1), 2, "the valid prompt tokens are found in every attention call")

# diffusers: tests/models/transformers/test_models_transformer_qwenimage_modulate_index.py
import unittest
from unittest import mock

import torch

from diffusers import QwenImageTransformer2DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class QwenImageModulateIndexOnceTests(unittest.TestCase):
    """With `zero_cond_t`, the QwenImage transformer builds `modulate_index` once per image shapes and device.

    `torch.tensor` of a nested Python list is a host-to-device copy that blocks the host, and the pipeline passes the
    same `img_shapes` in every denoising step.
    """

    def get_model(self):
        torch.manual_seed(0)
        return QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=16,
            guidance_embeds=False,
            axes_dims_rope=(8, 4, 4),
            zero_cond_t=True,
        ).to(torch_device)

    def get_dummy_inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        return {
            "hidden_states": torch.randn((1, 32, 16), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((1, 8, 16), generator=generator).to(torch_device),
            "encoder_hidden_states_mask": torch.ones((1, 8), dtype=torch.long, device=torch_device),
            "timestep": torch.tensor([1.0]).to(torch_device),
            # the image and one condition image, as an edit pipeline passes them
            "img_shapes": [[(1, 4, 4), (1, 4, 4)]],
        }

    def tensors_from_host_data(self, forwards):
        model = self.get_model()
        inputs = self.get_dummy_inputs()
        with torch.no_grad(), mock.patch.object(torch, "tensor", wraps=torch.tensor) as tensor:
            outputs = [model(**inputs, return_dict=False)[0] for _ in range(forwards)]
        torch.testing.assert_close(outputs[0], outputs[-1], rtol=0, atol=0)
        return sum(1 for call in tensor.call_args_list if call.args and isinstance(call.args[0], (list, tuple)))

    def test_modulate_index_built_once(self):
        self.assertEqual(
            self.tensors_from_host_data(1),
            self.tensors_from_host_data(3),
            "a tensor is built from host data in every forward",
        )

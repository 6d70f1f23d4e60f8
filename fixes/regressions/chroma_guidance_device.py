# diffusers: tests/models/transformers/test_models_transformer_chroma_guidance_device.py
import unittest
from unittest import mock

import torch

from diffusers import ChromaTransformer2DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


class ChromaGuidanceOnDeviceTests(unittest.TestCase):
    """The zero guidance embedding is made where the timestep is.

    `torch.tensor([0] * batch_size)` builds the guidance on the host from a Python list in every forward, and the
    embedding is then copied to the timestep's device: a host-to-device copy per transformer call on an accelerator.
    `torch.zeros(..., device=timestep.device)` makes it there instead.
    """

    def get_init_dict(self):
        return {
            "patch_size": 1,
            "in_channels": 4,
            "num_layers": 1,
            "num_single_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "axes_dims_rope": [4, 4, 8],
            "approximator_num_channels": 8,
            "approximator_hidden_dim": 16,
            "approximator_layers": 1,
        }

    def get_dummy_inputs(self, batch_size=2):
        generator = torch.Generator("cpu").manual_seed(0)
        height = width = 4
        sequence_length = 48
        return {
            "hidden_states": torch.randn((batch_size, height * width, 4), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((batch_size, sequence_length, 32), generator=generator).to(
                torch_device
            ),
            "img_ids": torch.randn((height * width, 3), generator=generator).to(torch_device),
            "txt_ids": torch.randn((sequence_length, 3), generator=generator).to(torch_device),
            "timestep": torch.tensor([1.0]).to(torch_device).expand(batch_size),
        }

    def test_no_tensor_built_from_host_data_in_forward(self):
        torch.manual_seed(0)
        model = ChromaTransformer2DModel(**self.get_init_dict()).to(torch_device).eval()
        inputs = self.get_dummy_inputs()

        with torch.no_grad(), mock.patch.object(torch, "tensor", wraps=torch.tensor) as tensor:
            model(**inputs)
        from_host = [call for call in tensor.call_args_list if call.args and isinstance(call.args[0], (list, tuple))]
        self.assertEqual(from_host, [], "a tensor is built from host data (and copied to the device) in every forward")

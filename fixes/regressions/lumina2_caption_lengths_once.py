# diffusers: tests/models/transformers/test_models_transformer_lumina2_caption_lengths_once.py
import contextlib
import unittest
from unittest import mock

import torch

from diffusers import Lumina2Transformer2DModel

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


class Lumina2CaptionLengthsOnceTests(unittest.TestCase):
    """Lumina 2's rotary embedding reads each caption's length once per mask, not in every transformer forward.

    `attention_mask.sum(dim=1).tolist()` is a device-to-host sync, and the pipeline passes the same prompt mask in
    every denoising step: the lengths are read once for that mask.
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
        mask = torch.ones((2, 16), dtype=torch.bool)
        mask[1, 10:] = False
        return {
            "hidden_states": torch.randn((2, 4, 16, 16), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((2, 16, 32), generator=generator).to(torch_device),
            "timestep": torch.rand(size=(2,), generator=generator).to(torch_device),
            "encoder_attention_mask": mask.to(torch_device),
        }

    def reads_in_forwards(self, model, inputs, forwards):
        with torch.no_grad(), count_host_reads() as counts:
            outputs = [model(**inputs, return_dict=False)[0] for _ in range(forwards)]
        return counts["reads"], outputs

    def test_caption_lengths_read_once_per_mask(self):
        model = self.get_model()
        one, _ = self.reads_in_forwards(model, self.get_dummy_inputs(), 1)
        model = self.get_model()
        three, outputs = self.reads_in_forwards(model, self.get_dummy_inputs(), 3)
        self.assertEqual(one, three, "the caption lengths are read to the host in every forward")
        torch.testing.assert_close(outputs[0], outputs[2], rtol=0, atol=0)

    def test_a_changed_mask_is_read_again(self):
        model = self.get_model()
        inputs = self.get_dummy_inputs()
        with torch.no_grad():
            first = model(**inputs, return_dict=False)[0]
            inputs["encoder_attention_mask"][1, 10:] = True  # in place: the same mask object, new lengths
            second = model(**inputs, return_dict=False)[0]
            expected = self.get_model()(**inputs, return_dict=False)[0]
        self.assertFalse(torch.equal(first, second))
        torch.testing.assert_close(second, expected, rtol=0, atol=0)

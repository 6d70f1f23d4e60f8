# diffusers: tests/hooks/test_faster_cache_freq_mask_device.py
import unittest
from unittest import mock

import torch

from diffusers.hooks.faster_cache import _split_low_high_freq


class FasterCacheFrequencyMaskOnDeviceTests(unittest.TestCase):
    """FasterCache's low/high-frequency split builds its mask where the states are.

    `torch.meshgrid(torch.arange(height), torch.arange(width))` builds the mask on the host, and `.to(x.device)`
    copies it to the states' device: a host-to-device copy in every hooked call on an accelerator. States on the
    `meta` device stand in for an accelerator's here: a tensor built on the host has to be moved there.
    """

    def split_moving(self, x):
        moves = []
        original_to = torch.Tensor.to

        def to(tensor, *args, **kwargs):
            moved = original_to(tensor, *args, **kwargs)
            if moved.device != tensor.device:
                moves.append((tensor.device, moved.device))
            return moved

        with mock.patch.object(torch.Tensor, "to", to):
            low, high = _split_low_high_freq(x)
        return low, high, moves

    def test_mask_built_on_the_states_device(self):
        x = torch.randn(2, 4, 16, 16, device="meta")
        low, high, moves = self.split_moving(x)
        self.assertEqual(moves, [], "the mask is built on the host and copied to the states' device")
        self.assertEqual((low.device, high.device), (x.device, x.device))

    def test_split_unchanged(self):
        x = torch.randn(2, 4, 16, 16, generator=torch.Generator("cpu").manual_seed(0))
        low, high, _ = self.split_moving(x)
        torch.testing.assert_close(low + high, torch.fft.fftshift(torch.fft.fft2(x)), rtol=0, atol=0)

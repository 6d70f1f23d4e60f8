# diffusers: tests/models/transformers/test_models_transformer_lumina2_rope_device.py
import unittest
from unittest import mock

import torch

from diffusers.models.transformers.transformer_lumina2 import Lumina2RotaryPosEmbed


class Lumina2RopeTablesOnDeviceTests(unittest.TestCase):
    """Lumina 2's rotary embedding copies its `freqs_cis` tables to the ids' device once per device, not in every call.

    `freqs_cis` is a plain list attribute, so the pipeline's `.to(device)` leaves it on the host, and every forward
    copied each axis's table to the device (a blocking host-to-device copy). Position ids on the `meta` device stand
    in for an accelerator's here: a table kept on the host has to be moved there.
    """

    def moves_in_calls(self, rope, ids, calls):
        moves = []
        original_to = torch.Tensor.to

        def to(tensor, *args, **kwargs):
            moved = original_to(tensor, *args, **kwargs)
            if moved.device != tensor.device:
                moves.append((tensor.device, moved.device))
            return moved

        with mock.patch.object(torch.Tensor, "to", to):
            for _ in range(calls):
                freqs_cis = rope._get_freqs_cis(ids)
        self.assertEqual(freqs_cis.device, ids.device)
        return len(moves)

    def get_rope(self):
        return Lumina2RotaryPosEmbed(theta=10000, axes_dim=(4, 2, 2), axes_lens=(128, 128, 128), patch_size=2)

    def test_tables_copied_once_per_device(self):
        ids = torch.zeros(2, 24, 3, dtype=torch.int32, device="meta")
        self.assertEqual(
            self.moves_in_calls(self.get_rope(), ids, 1),
            self.moves_in_calls(self.get_rope(), ids, 3),
            "the rope tables are copied to the device in every call",
        )

    def test_embeddings_unchanged(self):
        rope = self.get_rope()
        ids = torch.randint(0, 128, (2, 24, 3), generator=torch.Generator("cpu").manual_seed(0))
        expected = torch.cat(
            [freqs[ids[:, :, i]] for i, freqs in enumerate(rope._precompute_freqs_cis((4, 2, 2), (128,) * 3, 10000))],
            dim=-1,
        )
        for _ in range(2):
            torch.testing.assert_close(rope._get_freqs_cis(ids), expected, rtol=0, atol=0)

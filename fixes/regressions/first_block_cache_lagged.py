# diffusers: tests/hooks/test_first_block_cache_lagged.py
import unittest
from unittest import mock

import torch

from diffusers import FirstBlockCacheConfig, FluxTransformer2DModel

from ..testing_utils import require_torch_accelerator, torch_device


class FirstBlockCacheLaggedDecisionTests(unittest.TestCase):
    """The first-block cache decides whether to skip the remaining blocks from the previous call's residual ratio.

    Reading the current call's ratio with `.item()` makes the host wait for the device in every transformer call,
    before it can queue the remaining blocks. The ratio is copied to the host without a wait instead, and read in the
    next call: the decision lags by one call, so the cache skips from the third call on, not the second.
    """

    def get_model(self):
        torch.manual_seed(0)
        return FluxTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8],
        ).to(torch_device)

    def get_dummy_inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        return {
            "hidden_states": torch.randn((1, 16, 4), generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn((1, 48, 32), generator=generator).to(torch_device),
            "pooled_projections": torch.randn((1, 32), generator=generator).to(torch_device),
            "img_ids": torch.randn((16, 3), generator=generator).to(torch_device),
            "txt_ids": torch.randn((48, 3), generator=generator).to(torch_device),
            "timestep": torch.tensor([1.0]).to(torch_device),
        }

    def computed_tail(self, model, calls):
        """Whether each call ran the last block (the remaining blocks were computed, not taken from the cache)."""
        ran = []
        handle = model.single_transformer_blocks[-1].norm.register_forward_pre_hook(lambda *args: ran.append(True))
        inputs = self.get_dummy_inputs()
        computed = []
        with torch.no_grad(), model.cache_context("cond"):
            for _ in range(calls):
                ran.clear()
                model(**inputs)
                computed.append(bool(ran))
        handle.remove()
        return computed

    def test_the_decision_uses_the_previous_call_s_ratio(self):
        model = self.get_model()
        model.enable_cache(FirstBlockCacheConfig(threshold=0.5))
        # the same inputs in every call: every ratio after the first call is 0, below the threshold
        self.assertEqual(self.computed_tail(model, 4), [True, True, False, False])

    @require_torch_accelerator
    def test_the_ratio_is_not_read_from_the_device(self):
        model = self.get_model()
        model.enable_cache(FirstBlockCacheConfig(threshold=0.5))
        original_item = torch.Tensor.item
        read_on_device = []

        def item(tensor):
            if tensor.device.type != "cpu":
                read_on_device.append(tensor)
            return original_item(tensor)

        with mock.patch.object(torch.Tensor, "item", item):
            self.computed_tail(model, 4)
        self.assertEqual(read_on_device, [], "the ratio is read from the device in a transformer call")

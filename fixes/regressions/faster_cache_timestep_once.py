# diffusers: tests/hooks/test_faster_cache_timestep_once.py
import contextlib
import unittest
from unittest import mock

import torch

from diffusers import FasterCacheConfig, FluxTransformer2DModel

from ..testing_utils import torch_device


@contextlib.contextmanager
def count_host_reads():
    """Counts reads of a tensor's value on the host (a device-to-host sync on an accelerator): `.item()`, `.tolist()`
    and a tensor used as a bool, as a comparison in an `if` uses it."""
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


class FasterCacheTimestepOnceTests(unittest.TestCase):
    """FasterCache compares the current timestep with its skip ranges once per timestep, not in every hooked module.

    The pipelines keep the current timestep as a device tensor, so `low < timestep < high` in each hooked attention
    module's forward reads it to the host twice: syncs that grow with the number of blocks.
    """

    def get_model(self, num_layers):
        torch.manual_seed(0)
        return FluxTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=num_layers,
            num_single_layers=num_layers,
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

    def reads_in_two_forwards(self, num_layers):
        model = self.get_model(num_layers)
        # the first timestep outside the skip range computes and fills the cache, the second inside it uses it
        timesteps = [torch.tensor(1000.0, device=torch_device), torch.tensor(500.0, device=torch_device)]
        current = [timesteps[0]]
        model.enable_cache(
            FasterCacheConfig(
                spatial_attention_block_skip_range=2,
                spatial_attention_timestep_skip_range=(-1, 901),
                tensor_format="BCHW",
                is_guidance_distilled=True,
                current_timestep_callback=lambda: current[0],
            )
        )
        inputs = self.get_dummy_inputs()
        with torch.no_grad(), count_host_reads() as counts:
            model(**inputs)
            current[0] = timesteps[1]
            model(**inputs)
        return counts["reads"]

    def test_timestep_reads_do_not_grow_with_the_blocks(self):
        self.assertEqual(
            self.reads_in_two_forwards(1),
            self.reads_in_two_forwards(3),
            "each hooked block reads the timestep to the host in every forward",
        )

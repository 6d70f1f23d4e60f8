# diffusers: tests/pipelines/wan/test_wan_22_boundary_once.py
import contextlib
import unittest
from unittest import mock

import torch

from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

from ...testing_utils import enable_full_determinism, torch_device


enable_full_determinism()


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


class Wan22BoundaryOnceTests(unittest.TestCase):
    """Wan 2.2 chooses each step's expert from one comparison of all timesteps with the boundary, before the loop.

    `if t >= boundary_timestep` compares the device timestep in every step: a device-to-host sync per step.
    """

    def get_transformer(self):
        torch.manual_seed(0)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=16,
            out_channels=16,
            text_dim=32,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )

    def get_dummy_components(self):
        torch.manual_seed(0)
        vae = AutoencoderKLWan(
            base_dim=3,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        )
        return {
            "transformer": self.get_transformer(),
            "vae": vae,
            "scheduler": UniPCMultistepScheduler(
                prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
            ),
            "text_encoder": None,
            "tokenizer": None,
            "transformer_2": self.get_transformer(),
            "boundary_ratio": 0.875,
        }

    def get_dummy_inputs(self, num_inference_steps):
        generator = torch.Generator(device="cpu").manual_seed(0)
        return {
            "prompt_embeds": torch.randn((1, 16, 32), generator=generator).to(torch_device),
            "negative_prompt_embeds": torch.randn((1, 16, 32), generator=generator).to(torch_device),
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": 6.0,
            "height": 16,
            "width": 16,
            "num_frames": 9,
            "output_type": "latent",
        }

    def run_pipeline(self, num_inference_steps):
        pipe = WanPipeline(**self.get_dummy_components()).to(torch_device)
        pipe.set_progress_bar_config(disable=True)
        calls = {"transformer": 0, "transformer_2": 0}
        for name in calls:
            getattr(pipe, name).register_forward_pre_hook(
                lambda *args, name=name: calls.__setitem__(name, calls[name] + 1)
            )
        with count_host_reads() as counts:
            pipe(**self.get_dummy_inputs(num_inference_steps))
        return counts["reads"], calls

    def test_boundary_reads_do_not_grow_with_the_steps(self):
        reads_2, _ = self.run_pipeline(2)
        reads_4, calls = self.run_pipeline(4)
        self.assertEqual(reads_2, reads_4, "the timestep is compared with the boundary on the host in every step")
        # both experts run: the high-noise one before the boundary, the low-noise one after it
        self.assertGreater(calls["transformer"], 0)
        self.assertGreater(calls["transformer_2"], 0)

# diffusers: tests/pipelines/cogvideo/test_cogvideox_host_timestep.py
import contextlib
import unittest
from unittest import mock

import torch

from diffusers import (
    AutoencoderKLCogVideoX,
    CogVideoXDDIMScheduler,
    CogVideoXDPMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
)

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


class CogVideoXHostTimestepTests(unittest.TestCase):
    """The CogVideoX pipelines give the scheduler's `step` the timestep as a host number.

    The schedulers look their alphas up in host tensors with the timestep (`alphas_cumprod[timestep]`): indexing them
    with the device tensor `t` reads it to the host, three times per step, and `use_dynamic_cfg` reads it again with
    `t.item()`. The timesteps are read to the host once, before the loop.
    """

    def get_dummy_components(self, scheduler):
        torch.manual_seed(0)
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=4,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            time_embed_dim=2,
            text_embed_dim=32,
            num_layers=1,
            sample_width=2,
            sample_height=2,
            sample_frames=9,
            patch_size=2,
            temporal_compression_ratio=4,
            max_text_seq_length=16,
        )
        torch.manual_seed(0)
        vae = AutoencoderKLCogVideoX(
            in_channels=3,
            out_channels=3,
            down_block_types=("CogVideoXDownBlock3D",) * 4,
            up_block_types=("CogVideoXUpBlock3D",) * 4,
            block_out_channels=(8, 8, 8, 8),
            latent_channels=4,
            layers_per_block=1,
            norm_num_groups=2,
            temporal_compression_ratio=4,
        )
        return {
            "transformer": transformer,
            "vae": vae,
            "scheduler": scheduler,
            "text_encoder": None,
            "tokenizer": None,
        }

    def get_dummy_inputs(self, num_inference_steps=2, use_dynamic_cfg=False):
        generator = torch.Generator(device="cpu").manual_seed(0)
        return {
            "prompt_embeds": torch.randn((1, 16, 32), generator=generator).to(torch_device),
            "negative_prompt_embeds": torch.randn((1, 16, 32), generator=generator).to(torch_device),
            "generator": generator,
            "num_inference_steps": num_inference_steps,
            "guidance_scale": 6.0,
            "use_dynamic_cfg": use_dynamic_cfg,
            "height": 16,
            "width": 16,
            "num_frames": 8,
            "max_sequence_length": 16,
            "output_type": "latent",
        }

    def get_pipeline(self, scheduler):
        pipe = CogVideoXPipeline(**self.get_dummy_components(scheduler)).to(torch_device)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def test_scheduler_step_gets_a_host_timestep(self):
        for scheduler in (CogVideoXDDIMScheduler(), CogVideoXDPMScheduler()):
            with self.subTest(scheduler=type(scheduler).__name__):
                pipe = self.get_pipeline(scheduler)
                with mock.patch.object(pipe.scheduler, "step", wraps=pipe.scheduler.step) as step:
                    pipe(**self.get_dummy_inputs())
                self.assertEqual(step.call_count, 2)
                for call in step.call_args_list:
                    timesteps = call.args[1:2] if isinstance(scheduler, CogVideoXDDIMScheduler) else call.args[2:4]
                    for timestep in timesteps:
                        self.assertFalse(torch.is_tensor(timestep), "the scheduler gets the device timestep")

    def test_dynamic_cfg_reads_do_not_grow_with_the_steps(self):
        reads = []
        for steps in (2, 4):
            pipe = self.get_pipeline(CogVideoXDPMScheduler())
            with count_host_reads() as counts:
                pipe(**self.get_dummy_inputs(steps, use_dynamic_cfg=True))
            reads.append(counts["reads"])
        self.assertEqual(reads[0], reads[1], "the timestep is read to the host in every denoising step")

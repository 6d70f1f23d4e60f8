# diffusers: tests/schedulers/test_scheduler_unipc_host_coeffs.py
import unittest
from unittest import mock

import torch

from diffusers import UniPCMultistepScheduler


class UniPCHostCoefficientsTests(unittest.TestCase):
    """UniPC computes its coefficient chain (sigmas, `rks`, the solved `rhos`) on the host, where the sigmas are.

    Moving each sigma to the sample's device and solving for the `rhos` there makes every step wait for the device:
    small host-to-device copies, and `torch.linalg.solve`'s check of its result. Only the sample's own update runs on
    the device. Samples on the `meta` device stand in for an accelerator's here: a tensor moved there is a copy a
    step would make.
    """

    def moves_per_step(self, **config):
        scheduler = UniPCMultistepScheduler(**config)
        scheduler.set_timesteps(6)
        scheduler.set_begin_index(0)
        generator = torch.Generator("cpu").manual_seed(0)
        sample = torch.randn(1, 4, 8, 8, generator=generator).to("meta")
        original_to = torch.Tensor.to
        moves = []

        def to(tensor, *args, **kwargs):
            moved = original_to(tensor, *args, **kwargs)
            if moved.device != tensor.device:
                moves.append((tensor.device, moved.device))
            return moved

        per_step = []
        with mock.patch.object(torch.Tensor, "to", to):
            for t in scheduler.timesteps:
                model_output = torch.randn(1, 4, 8, 8, generator=generator).to("meta")
                before = len(moves)
                sample = scheduler.step(model_output, t, sample).prev_sample
                per_step.append(len(moves) - before)
        self.assertEqual(sample.device.type, "meta")
        return per_step

    def test_no_copy_to_the_device_in_a_step(self):
        for config in ({"solver_order": 2}, {"solver_order": 3}, {"solver_order": 3, "predict_x0": False}):
            with self.subTest(**config):
                self.assertEqual(self.moves_per_step(**config), [0] * 6)

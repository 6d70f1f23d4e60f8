# diffusers: tests/pipelines/test_pipelines_sequential_offload_pin_memory.py
import unittest

import torch

from diffusers import DiffusionPipeline
from diffusers.models import ModelMixin


class DummyModel(ModelMixin):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


class DummyPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "model"

    def __init__(self, model):
        super().__init__()
        self.register_modules(model=model)

    def __call__(self, x):
        return self.model(x)


class SequentialOffloadPinMemoryTests(unittest.TestCase):
    """`enable_sequential_cpu_offload(pin_memory=...)` passes the option on to accelerate's `cpu_offload`.

    It is off by default. With `pin_memory=True`, an accelerate whose `cpu_offload` has no such argument is refused in
    one clear error, instead of a `TypeError` from inside accelerate.
    """

    def get_pipeline(self):
        torch.manual_seed(0)
        return DummyPipeline(DummyModel())

    def test_pin_memory_off_offloads_as_before(self):
        pipe = self.get_pipeline()
        pipe.enable_sequential_cpu_offload(device="cpu", pin_memory=False)
        # the weights live in the hooks' state dict, on the host and not pinned; the modules hold `meta` tensors
        self.assertEqual(pipe.model.linear.weight.device.type, "meta")
        weights = pipe.model.linear._hf_hook.weights_map
        self.assertFalse(any(weights[name].is_pinned() for name in ("weight", "bias")))

    def test_pin_memory_needs_an_accelerate_that_takes_it(self):
        import inspect

        from accelerate import cpu_offload

        if "pin_memory" in inspect.signature(cpu_offload).parameters:
            self.skipTest("this accelerate's `cpu_offload` takes `pin_memory`")
        with self.assertRaisesRegex(ValueError, "requires a version of `accelerate`"):
            self.get_pipeline().enable_sequential_cpu_offload(device="cpu", pin_memory=True)

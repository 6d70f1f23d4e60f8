# diffusers: tests/pipelines/test_pipelines_model_offload_pin_memory.py
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


class ModelOffloadPinMemoryTests(unittest.TestCase):
    """`enable_model_cpu_offload(pin_memory=...)` passes the option on to accelerate's `cpu_offload_with_hook`.

    It is off by default. With `pin_memory=True`, an accelerate whose `cpu_offload_with_hook` has no such argument is refused in
    one clear error, instead of a `TypeError` from inside accelerate.
    """

    def get_pipeline(self):
        torch.manual_seed(0)
        return DummyPipeline(DummyModel())

    def test_pin_memory_off_changes_nothing(self):
        pipe = self.get_pipeline()
        x = torch.randn(2, 4)
        with torch.no_grad():
            expected = pipe(x)
            pipe.enable_model_cpu_offload(device="cpu", pin_memory=False)
            output = pipe(x)
        self.assertTrue(torch.equal(output, expected))

    def test_pin_memory_needs_an_accelerate_that_takes_it(self):
        import inspect

        from accelerate import cpu_offload_with_hook

        if "pin_memory" in inspect.signature(cpu_offload_with_hook).parameters:
            self.skipTest("this accelerate's `cpu_offload_with_hook` takes `pin_memory`")
        with self.assertRaisesRegex(ValueError, "requires a version of `accelerate`"):
            self.get_pipeline().enable_model_cpu_offload(device="cpu", pin_memory=True)

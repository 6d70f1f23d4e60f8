# diffusers: tests/pipelines/test_pipelines_model_offload_free_hooks.py
import unittest
from unittest import mock

import torch
from accelerate.hooks import UserCpuOffloadHook

from diffusers import DiffusionPipeline
from diffusers.models import ModelMixin


class DummyModel(ModelMixin):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


class DummyPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "first->second"

    def __init__(self, first, second):
        super().__init__()
        self.register_modules(first=first, second=second)

    def __call__(self, x):
        x = self.second(self.first(x))
        self.maybe_free_model_hooks()
        return x


class ModelOffloadFreeHooksTests(unittest.TestCase):
    """At the end of a call, `maybe_free_model_hooks` offloads each model through its accelerate hook before it
    enables the offload again.

    The hook moves a model back as accelerate does between the models of a call, which an accelerate may do without
    copying back the weights that did not change on the device; `self.to("cpu")` can only copy them.
    """

    def get_pipeline(self):
        torch.manual_seed(0)
        return DummyPipeline(DummyModel(), DummyModel())

    def test_each_model_is_offloaded_by_its_hook_at_the_end_of_a_call(self):
        pipe = self.get_pipeline()
        pipe.enable_model_cpu_offload(device="cpu")
        offloaded = []
        offload = UserCpuOffloadHook.offload

        def recording_offload(hook):
            offloaded.append(hook.model)
            return offload(hook)

        with mock.patch.object(UserCpuOffloadHook, "offload", recording_offload), torch.no_grad():
            pipe(torch.randn(2, 4))
        # `second`'s hook offloads `first` when it runs; at the end of the call each is offloaded by its own hook
        self.assertEqual(offloaded[-2:], [pipe.first, pipe.second])
        self.assertEqual(offloaded.count(pipe.second), 1)

    def test_outputs_and_the_offload_after_the_call_are_unchanged(self):
        pipe = self.get_pipeline()
        x = torch.randn(2, 4)
        with torch.no_grad():
            expected = pipe(x)
            pipe.enable_model_cpu_offload(device="cpu")
            first = pipe(x)
            second = pipe(x)
        self.assertTrue(torch.equal(first, expected))
        self.assertTrue(torch.equal(second, expected))
        self.assertEqual(len(pipe._all_hooks), 2)
        self.assertTrue(all(p.device == torch.device("cpu") for p in pipe.first.parameters()))

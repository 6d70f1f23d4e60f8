# accelerate: tests/test_cpu_offload_sequential_pinned.py
# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import unittest
from unittest import mock

import torch
import torch.nn as nn

from accelerate import hooks
from accelerate.big_modeling import cpu_offload
from accelerate.test_utils import require_non_cpu, torch_device


class ModelForTest(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


class SequentialOffloadPinnedTester(unittest.TestCase):
    """
    `cpu_offload(..., pin_memory=True)` copies the state dict the hooks load from into page-locked (pinned) memory
    once, and each load of a pinned weight is a copy without a wait for the device. It is off by default: nothing
    changes unless asked.
    """

    def offloaded(self, execution_device, pin_memory):
        torch.manual_seed(0)
        model = ModelForTest().eval()
        inputs = torch.randn(2, 3)
        with torch.no_grad():  # the same device's kernels: the model without offloading, on the execution device
            expected = model.to(execution_device)(inputs.to(execution_device)).cpu()
        model.cpu()
        cpu_offload(model, execution_device=execution_device, pin_memory=pin_memory)
        with (
            mock.patch.object(hooks, "set_module_tensor_to_device", wraps=hooks.set_module_tensor_to_device) as load,
            torch.no_grad(),
        ):
            for _ in range(2):
                output = model(inputs)
        assert torch.equal(output.cpu(), expected)
        # the loads of each forward; `post_forward` points the weights back at `meta` with the same function
        loads = [call for call in load.call_args_list if str(call.args[2]) != "meta"]
        return model, loads

    def test_pin_memory_is_an_option_off_by_default(self):
        model, loads = self.offloaded("cpu", pin_memory=False)
        assert len(loads) > 0
        assert not any(call.kwargs.get("non_blocking") for call in loads)
        assert not any(model.linear1._hf_hook.weights_map[name].is_pinned() for name in ("weight", "bias"))

    @require_non_cpu
    def test_pinned_loads_without_a_wait(self):
        model, loads = self.offloaded(torch_device, pin_memory=True)
        assert all(model.linear1._hf_hook.weights_map[name].is_pinned() for name in ("weight", "bias"))
        assert len(loads) > 0 and all(call.kwargs.get("non_blocking") for call in loads)

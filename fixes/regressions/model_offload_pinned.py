# accelerate: tests/test_cpu_offload_pinned.py
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

import torch
import torch.nn as nn

from accelerate.big_modeling import cpu_offload_with_hook
from accelerate.test_utils import require_non_cpu, torch_device


class ModelForTest(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


class CpuOffloadPinnedTester(unittest.TestCase):
    """
    `cpu_offload_with_hook(..., pin_memory=True)` keeps the model's CPU weights in page-locked (pinned) memory, so
    that moving the model to the execution device copies them without blocking the host. It is off by default:
    nothing changes unless asked.
    """

    def test_pin_memory_is_an_option_off_by_default(self):
        torch.manual_seed(0)
        model = ModelForTest().eval()
        inputs = torch.randn(2, 3)
        with torch.no_grad():
            expected = model(inputs)
        model, hook = cpu_offload_with_hook(model, execution_device="cpu", pin_memory=False)
        with torch.no_grad():
            output = model(inputs)
        hook.offload()
        assert torch.equal(output, expected)
        assert not any(param.is_pinned() for param in model.parameters())

    @require_non_cpu
    def test_pinned_weights_after_each_offload(self):
        torch.manual_seed(0)
        model = ModelForTest().eval()
        inputs = torch.randn(2, 3)
        with torch.no_grad():  # the same device's kernels: the model without offloading, on the device
            expected = model.to(torch_device)(inputs.to(torch_device)).cpu()
        model.cpu()
        model, hook = cpu_offload_with_hook(model, execution_device=torch_device, pin_memory=True)
        assert all(param.is_pinned() for param in model.parameters())
        for _ in range(2):
            with torch.no_grad():
                output = model(inputs)
            hook.offload()
            assert all(param.device.type == "cpu" and param.is_pinned() for param in model.parameters())
        assert torch.equal(output.cpu(), expected)

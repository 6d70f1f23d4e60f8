# accelerate: tests/test_cpu_offload_keep_host.py
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
from accelerate.hooks import remove_hook_from_module
from accelerate.test_utils import require_non_cpu, torch_device


class ModelForTest(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


class CpuOffloadKeepHostTester(unittest.TestCase):
    """
    Model CPU offload offloads a model by pointing its parameters back at the CPU tensors they were copied from: they
    did not change on the execution device, so copying them back (a blocking device-to-host copy per weight) only
    makes new CPU copies of what the CPU already holds. A parameter written on the device is copied back as before.
    """

    @require_non_cpu
    def test_offload_points_parameters_back_at_their_cpu_tensors(self):
        torch.manual_seed(0)
        model = ModelForTest().eval()
        host = {name: param.data_ptr() for name, param in model.named_parameters()}
        model, hook = cpu_offload_with_hook(model, execution_device=torch_device)
        with torch.no_grad():
            model(torch.randn(2, 3))
        assert model.linear1.weight.device.type == torch.device(torch_device).type
        hook.offload()
        for name, param in model.named_parameters():
            assert param.device == torch.device("cpu"), name
            assert param.data_ptr() == host[name], f"{name} was copied back, not pointed back at its CPU tensor"

    @require_non_cpu
    def test_a_parameter_changed_on_the_device_is_copied_back(self):
        model = ModelForTest().eval()
        model, hook = cpu_offload_with_hook(model, execution_device=torch_device)
        with torch.no_grad():
            model(torch.randn(2, 3))
            model.linear2.bias.fill_(3.0)
        hook.offload()
        assert torch.equal(model.linear2.bias, torch.full((5,), 3.0))
        with torch.no_grad():
            model(torch.randn(2, 3))
        remove_hook_from_module(model)
        assert torch.equal(model.linear2.bias.cpu(), torch.full((5,), 3.0))

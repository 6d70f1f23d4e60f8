# accelerate: tests/test_cpu_offload_keep_cache.py
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


class SequentialOffloadKeepCacheTester(unittest.TestCase):
    """
    Sequential CPU offload loads each weight without emptying the device's memory cache: the weights the previous
    module freed are in the cache, and the next module's take their place. Emptying it at every load hands them back
    to the driver (a wait for the device) and allocates them again.
    """

    def loads(self, execution_device):
        torch.manual_seed(0)
        model = ModelForTest().eval()
        inputs = torch.randn(2, 3)
        with torch.no_grad():  # the same device's kernels: the model without offloading, on the execution device
            expected = model.to(execution_device)(inputs.to(execution_device)).cpu()
        model.cpu()
        cpu_offload(model, execution_device=execution_device)
        with (
            mock.patch.object(hooks, "set_module_tensor_to_device", wraps=hooks.set_module_tensor_to_device) as load,
            mock.patch.object(torch.cuda, "empty_cache", wraps=torch.cuda.empty_cache) as empty_cache,
            torch.no_grad(),
        ):
            for _ in range(2):
                output = model(inputs)
        assert torch.equal(output.cpu(), expected)
        # the loads of each forward; `post_forward` points the weights back at `meta` with the same function
        loads = [call for call in load.call_args_list if str(call.args[2]) != "meta"]
        return loads, empty_cache.call_count

    def test_loads_keep_the_cache(self):
        loads, _ = self.loads("cpu")
        assert len(loads) > 0
        assert all(call.kwargs.get("clear_cache") is False for call in loads), "a load empties the device's cache"

    @require_non_cpu
    def test_no_empty_cache_in_the_forwards(self):
        _, empty_cache = self.loads(torch_device)
        assert empty_cache == 0, "the device's cache is emptied in the forwards"

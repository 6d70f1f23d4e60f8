# diffusers: tests/hooks/test_group_offloading_pinned.py
import torch

from diffusers.hooks import apply_group_offloading
from diffusers.models import ModelMixin

from ..testing_utils import require_torch_accelerator, torch_device


class DummyBlock(torch.nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.proj_in = torch.nn.Linear(features, features)
        self.activation = torch.nn.ReLU()
        self.proj_out = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(self.activation(self.proj_in(x)))


class DummyModel(ModelMixin):
    def __init__(self, features: int, num_layers: int) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(features, features)
        self.blocks = torch.nn.ModuleList([DummyBlock(features) for _ in range(num_layers)])
        self.linear_2 = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_1(x)
        for block in self.blocks:
            x = block(x)
        return self.linear_2(x)


class TestGroupOffloadPinned:
    """Group offloading without a stream keeps its host weights pinned, as the stream path does unless
    `low_cpu_mem_usage`, so that each onload copies them without a host wait, and offloads by pointing the weights
    back at them (nothing copied back)."""

    features = 8
    num_layers = 3

    def get_model(self):
        torch.manual_seed(0)
        return DummyModel(self.features, self.num_layers)

    def get_offloaded_model(self, low_cpu_mem_usage=False):
        model = self.get_model()
        apply_group_offloading(
            model,
            onload_device=torch.device(torch_device),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            low_cpu_mem_usage=low_cpu_mem_usage,
        )
        return model

    @require_torch_accelerator
    def test_the_host_weights_are_pinned_and_pointed_back_at(self):
        x = torch.randn(2, self.features, generator=torch.Generator("cpu").manual_seed(0))
        with torch.no_grad():
            # the same device's kernels: the model without offloading, on the device
            expected = self.get_model().to(torch_device)(x.to(torch_device)).cpu()
            model = self.get_offloaded_model()
            host = {name: param.data_ptr() for name, param in model.named_parameters()}
            outputs = [model(x.to(torch_device)).cpu() for _ in range(2)]
        for name, param in model.named_parameters():
            assert param.device.type == "cpu", name
            assert param.is_pinned(), f"{name} is not pinned"
            assert param.data_ptr() == host[name], f"{name} was copied back, not pointed back at its host tensor"
        for output in outputs:
            assert torch.equal(output, expected)

    @require_torch_accelerator
    def test_low_cpu_mem_usage_pins_no_block(self):
        model = self.get_offloaded_model(low_cpu_mem_usage=True)
        with torch.no_grad():
            model(torch.randn(2, self.features, device=torch_device))
        for name, param in model.blocks.named_parameters():
            assert param.device.type == "cpu", name
            assert not param.is_pinned(), f"{name} is pinned although low_cpu_mem_usage=True"

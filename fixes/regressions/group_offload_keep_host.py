# diffusers: tests/hooks/test_group_offloading_keep_host.py
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


class TestGroupOffloadKeepHost:
    """Group offloading without a stream offloads a group by pointing its weights back at their host tensors.

    The weights never change on the onload device, so copying them back after every forward (a blocking
    device-to-host copy of every weight) only makes new host copies of what the host already holds. A weight replaced
    while offloaded (`model.to(dtype)`) is the one pointed back at from then on.
    """

    features = 8
    num_layers = 3

    def get_model(self):
        torch.manual_seed(0)
        return DummyModel(self.features, self.num_layers)

    def get_offloaded_model(self):
        model = self.get_model()
        apply_group_offloading(
            model,
            onload_device=torch.device(torch_device),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
        )
        return model

    @require_torch_accelerator
    def test_offloading_points_the_weights_back_at_their_host_tensors(self):
        model = self.get_offloaded_model()
        host = {name: param.data_ptr() for name, param in model.named_parameters()}
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(2, self.features, device=torch_device))
        for name, param in model.named_parameters():
            assert param.device.type == "cpu", name
            assert param.data_ptr() == host[name], f"{name} was copied back, not pointed back at its host tensor"

    def test_outputs_unchanged(self):
        x = torch.randn(2, self.features, generator=torch.Generator("cpu").manual_seed(0))
        with torch.no_grad():
            # the same device's kernels: the model without offloading, on the device
            expected = self.get_model().to(torch_device)(x.to(torch_device)).cpu()
            model = self.get_offloaded_model()
            outputs = [model(x.to(torch_device)).cpu() for _ in range(2)]
        for output in outputs:
            assert torch.equal(output, expected)

    def test_a_weight_replaced_while_offloaded_is_kept(self):
        x = torch.randn(2, self.features, generator=torch.Generator("cpu").manual_seed(0))
        with torch.no_grad():
            model = self.get_offloaded_model()
            model(x.to(torch_device))
            for param in model.parameters():
                param.data = param.data.double()
            model(x.double().to(torch_device))
        assert {param.dtype for param in model.parameters()} == {torch.float64}

# diffusers: tests/hooks/test_group_offloading_top_level.py
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
        self.scale = torch.nn.Parameter(torch.ones(features))
        self.linear_1 = torch.nn.Linear(features, features)
        self.blocks = torch.nn.ModuleList([DummyBlock(features) for _ in range(num_layers)])
        self.linear_2 = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_1(x) * self.scale
        for block in self.blocks:
            x = block(x)
        return self.linear_2(x)


class TestGroupOffloadTopLevel:
    """Block-level group offloading moves the denoiser's top-level weights (those outside its blocks) with one group
    of their own, and with a stream copies them from pinned host copies without a host wait.

    The top-level group holds the modules outside the blocks (`linear_1`, `linear_2`) and the parameters of the model
    itself (`scale`): a weight of one of those modules listed again among the group's own parameters is moved twice
    per call. With a stream, the blocks onload from pinned memory, but the top-level group copied its weights there
    and back with blocking copies in every call.
    """

    features = 8
    num_layers = 2

    def get_model(self):
        torch.manual_seed(0)
        return DummyModel(self.features, self.num_layers)

    def top_level_group(self, model):
        return model._diffusers_hook.get_hook("group_offloading").group

    def test_each_weight_is_moved_by_one_group(self):
        model = self.get_model()
        apply_group_offloading(
            model,
            onload_device=torch.device(torch_device),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
        )
        group = self.top_level_group(model)
        in_modules = {id(p) for module in group.modules for p in module.parameters()}
        own = list(group.parameters)
        assert [id(p) for p in own] == [id(model.scale)]
        assert not in_modules & {id(p) for p in own}, "a weight is listed twice in the top-level group"

    @require_torch_accelerator
    def test_top_level_weights_onload_from_pinned_memory_with_a_stream(self):
        x = torch.randn(2, self.features, generator=torch.Generator("cpu").manual_seed(0))
        with torch.no_grad():
            # the same device's kernels: the model without offloading, on the device
            expected = self.get_model().to(torch_device)(x.to(torch_device)).cpu()
            model = self.get_model()
            apply_group_offloading(
                model,
                onload_device=torch.device(torch_device),
                offload_device=torch.device("cpu"),
                offload_type="block_level",
                num_blocks_per_group=1,
                use_stream=True,
            )
            group = self.top_level_group(model)
            outputs = [model(x.to(torch_device)).cpu() for _ in range(2)]
        assert group.cpu_param_dict and all(t.is_pinned() for t in group.cpu_param_dict.values())
        for output in outputs:
            assert torch.equal(output, expected)

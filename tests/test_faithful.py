"""A scenario is the pipeline a user gets: the lab's random-weight build equals a `save_pretrained` ->
`from_pretrained(torch_dtype=...)` -> `.to(device)` round trip of the same weights, tensor for tensor (parameters,
buffers, and tensors kept as plain attributes) and bit for bit in its output."""

import dataclasses

import pytest
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from lab.run.runner import timed_call
from lab.run.scenario import _model_dtype, build, catalog, faithful_model, resolve


def round_trip(built, folder):
    """The user's path for the same weights: each model saved, loaded back in its dtype, the pipeline moved."""
    components = dict(built.pipe.components)
    for name, model in built.scenario.models.items():
        components[name].save_pretrained(folder / name)
        components[name] = resolve(model.cls).from_pretrained(folder / name,
                                                               torch_dtype=_model_dtype(model, built.dtype))
    components["scheduler"] = type(built.pipe.scheduler).from_config(built.pipe.scheduler.config)
    pipe = type(built.pipe)(**components, **built.scenario.pipeline_kwargs)
    pipe.to(built.device)
    return dataclasses.replace(built, pipe=pipe)


def tensors(module: torch.nn.Module) -> dict[str, tuple]:
    """Every tensor in the module tree: parameters and buffers (shape, dtype, device) and plain tensor attributes,
    also inside a list, tuple or dict (dtype, device)."""
    out = {f"param {n}": (tuple(p.shape), p.dtype, p.device.type) for n, p in module.named_parameters()}
    out |= {f"buffer {n}": (tuple(b.shape), b.dtype, b.device.type) for n, b in module.named_buffers()}
    for prefix, sub in module.named_modules():
        for name, value in vars(sub).items():
            items = {name: value} if isinstance(value, torch.Tensor) else (
                {f"{name}[{i}]": v for i, v in enumerate(value)} if isinstance(value, (list, tuple)) else
                {f"{name}[{k}]": v for k, v in value.items()} if isinstance(value, dict) else {})
            for key, tensor in items.items():
                if isinstance(tensor, torch.Tensor) and not name.startswith("_"):
                    out[f"plain {prefix}.{key}"] = (tensor.dtype, tensor.device.type)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(catalog()))
def test_the_build_is_what_from_pretrained_and_to_give(name, tmp_path):
    from tests.test_scenarios import NEEDS

    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{name} needs {NEEDS[name]}, which the CPU build of torch here lacks")
    built = build(catalog()[name], size="tiny", device="cpu", dtype=torch.bfloat16)
    user = round_trip(built, tmp_path)
    for component, model in built.scenario.models.items():
        ours, theirs = tensors(built.pipe.components[component]), tensors(user.pipe.components[component])
        assert ours.keys() == theirs.keys(), f"{component}: {sorted(ours.keys() ^ theirs.keys())[:5]}"
        differ = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
        assert not differ, f"{component}: {len(differ)} tensors differ, e.g. {list(differ.items())[:3]}"
    a, b = timed_call(built, seed=0, marks=False).output, timed_call(user, seed=0, marks=False).output
    assert torch.equal(a, b), f"outputs differ by up to {(a.float() - b.float()).abs().max().item()}"


def test_keep_in_fp32_modules_stay_in_float32():
    built = build(catalog()["wan"], size="tiny", device="cpu", dtype=torch.bfloat16)
    transformer = built.pipe.transformer
    keep = type(transformer)._keep_in_fp32_modules
    fp32 = {n for n, p in transformer.named_parameters() if p.dtype == torch.float32}
    assert fp32 and all(any(k in n.split(".") for k in keep) for n in fp32)
    assert {n for n, p in transformer.named_parameters() if any(k in n.split(".") for k in keep)} == fp32
    assert transformer.scale_shift_table.dtype == torch.float32
    assert transformer.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16


class PlainTensorModel(torch.nn.Module):
    """A model that keeps a tensor as a plain attribute and copies it to the input's device in every forward, as
    Qwen-Image's rope does."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.register_buffer("scale", torch.ones(width), persistent=False)
        self.table = torch.arange(width, dtype=torch.float32)  # not a parameter, not a buffer

    def forward(self, x):
        return self.proj(x) * self.scale + self.table.to(x.device)


def test_a_plain_tensor_attribute_stays_on_the_host_as_from_pretrained_leaves_it():
    model = faithful_model(PlainTensorModel, {"width": 4}, torch.bfloat16, "meta")
    assert model.proj.weight.device.type == "meta" and model.proj.weight.dtype == torch.bfloat16
    assert model.table.device.type == "cpu" and model.table.dtype == torch.float32  # as __init__ made it
    assert model.scale.device.type == "cpu" and model.scale.dtype == torch.bfloat16  # non-persistent: __init__'s
    model.to("meta")  # what a user's `.to(device)` moves: parameters and buffers
    assert model.scale.device.type == "meta" and model.table.device.type == "cpu"


def test_results_record_the_build_and_tables_refuse_to_mix_builds():
    from lab import results
    from lab.base.errors import LabError

    old = {"name": "a", "environment": {"gpu": "H200"}}
    new = {"name": "b", "environment": {"gpu": "H200"}, "build": "faithful"}
    assert results.build_of(old) == "old" and results.build_of(new) == "faithful"
    with pytest.raises(LabError, match="built differently: a by the old build, b by the faithful build"):
        results.check_compatible(old, new)
    results.check_compatible(old, new, allow=True)
    assert build(catalog()["wan"], size="tiny", device="cpu").build == "faithful"


class Toy(ModelMixin, ConfigMixin):
    """Each kind of tensor a model keeps: parameters (one module kept in float32), a persistent float32 buffer (cast
    on loading), a non-persistent one and plain tensor attributes (left as `__init__` made them)."""

    _keep_in_fp32_modules = ["norm"]  # noqa: RUF012 - a list, as diffusers' models have it

    @register_to_config
    def __init__(self, dim: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.register_buffer("scale", torch.ones(dim, dtype=torch.float32))
        self.register_buffer("steps", torch.arange(dim, dtype=torch.float32), persistent=False)
        self.freqs = torch.arange(dim) / dim  # a plain attribute in the default dtype
        self.tables = [torch.ones(dim, dtype=torch.float64)]

    def forward(self, x):
        return self.norm(self.linear(x).float()).to(x.dtype) * self.scale * self.steps + self.freqs.to(x.device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_each_kind_of_tensor_as_loading_leaves_it(tmp_path, dtype):
    torch.manual_seed(0)
    model = faithful_model(Toy, {"dim": 4}, dtype, "cpu")
    model.save_pretrained(tmp_path)
    loaded = Toy.from_pretrained(tmp_path, torch_dtype=dtype).to("cpu")
    assert tensors(model) == tensors(loaded)
    assert model.norm.weight.dtype == torch.float32 and model.scale.dtype == dtype and model.steps.dtype == torch.float32
    assert model.freqs.dtype == dtype and model.tables[0].dtype == torch.float64
    x = torch.randn(2, 4).to(dtype)
    assert torch.equal(model(x), loaded(x))


def test_the_estimate_counts_float32_modules_at_four_bytes():
    from lab.run.scenario import estimate

    wan = catalog()["wan"]
    est = estimate(wan, "tiny", None, torch.bfloat16)
    # every transformer parameter at 2 bytes and the float32 VAE at 4 would be the estimate without the kept modules
    assert est.weight_bytes > 2 * est.params["transformer"] + 4 * est.params["vae"]
    assert est.weight_bytes < estimate(wan, "tiny", None, torch.float32).weight_bytes

"""What a scenario is: one module in `scenarios/` defining `SCENARIO = Scenario(...)`, which names the pipeline class
and checkpoint, the call settings of the upstream profiling harness, the model configs at `full` (true) and `tiny`
size with where each number came from, and the prompt-embedding shapes that stand in for the text encoders; the
classes it names, resolved on the installed diffusers; and the catalog of them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from lab.base.discovery import discover
from lab.base.errors import LabError, unknown_name

SIZES = ("full", "tiny", "pretrained")


def resolve(dotted: str) -> Any:
    """`diffusers.FluxPipeline` -> the class (imports deferred, as upstream's `build_registry` does)."""
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (AttributeError, ModuleNotFoundError):
        if not dotted.startswith("diffusers."):
            raise
        import diffusers

        raise MissingClass(f"diffusers {diffusers.__version__} has no `{dotted}`.") from None


class MissingClass(LabError):
    """A scenario's pipeline, model or scheduler class that the imported diffusers does not have."""


@dataclasses.dataclass(frozen=True)
class Model:
    """A model component: its class and its configs at each size. `blocks` are the config keys `--layers` sets."""

    cls: str
    full: dict[str, Any]
    tiny: dict[str, Any]
    blocks: tuple[str, ...] = ()
    dtype: str = "model"  # "model": the scenario dtype; "float32": always fp32 (e.g. Wan's VAE)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One target pipeline, as the upstream harness's `PipelineProfilingConfig` describes it, plus sizes."""

    name: str
    pipeline_cls: str
    checkpoint: str
    description: str
    #: the call settings (besides prompts), as the upstream profiling harness passes them
    call: dict[str, Any]
    #: overrides of `call` at tiny size (small height/width/frames)
    tiny_call: dict[str, Any]
    #: components: name -> Model, plus the scheduler as (class, config): a scheduler holds no weights, so every size
    #: builds the checkpoint's own (a tiny run takes the same schedule paths as a full one: shifts, terminal stretch)
    models: dict[str, Model]
    scheduler: tuple[str, dict[str, Any]]
    #: (components, size, batch, device, dtype, generator) -> prompt-embedding kwargs of the true shapes
    prompt_inputs: Callable[..., dict[str, Any]]
    #: extra pipeline constructor kwargs (e.g. `is_distilled`)
    pipeline_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: where each number came from (config key -> source)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    #: call kwargs that are passed only if the installed pipeline accepts them (pins across diffusers versions)
    pinned_if_supported: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: lines of diffusers that a full call runs and a tiny one cannot ("path:line" in the diffusers the lab pins ->
    #: why), for the report of what tiny leaves out (`benchmarks/tiny_coverage.py`); every other such line is a
    #: difference between the tiny build and the user's, to be mended in the tiny config
    tiny_leaves_out: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def denoiser(self) -> str:
        """The component the denoising loop calls every step: `transformer`, or `unet` in a UNet pipeline."""
        return "unet" if "unet" in self.models and "transformer" not in self.models else "transformer"

    def call_for(self, size: str) -> dict[str, Any]:
        """The call settings at `size`: `call`, with `tiny_call` over it at tiny size."""
        return {**self.call, **self.tiny_call} if size == "tiny" else dict(self.call)

    def call_kwargs(self, size: str, steps: int, full_decode: bool) -> dict[str, Any]:
        kwargs = self.call_for(size)
        kwargs["num_inference_steps"] = steps
        accepted = inspect.signature(resolve(self.pipeline_cls).__call__).parameters
        video = "num_frames" in kwargs or "video" in accepted
        kwargs["output_type"] = ("np" if video else "pil") if full_decode else "latent"
        kwargs.update({k: v for k, v in self.pinned_if_supported.items() if k in accepted})
        return kwargs

    def config(self, component: str, size: str, layers: int | None = None) -> dict[str, Any]:
        model = self.models[component]
        config = dict(model.tiny if size == "tiny" else model.full)
        if layers is not None:
            defaults = inspect.signature(resolve(model.cls).__init__).parameters
            for key in model.blocks:
                # a key absent from the config is the class default (the true value for most checkpoints)
                config[key] = min(layers, config.get(key, defaults[key].default))
        return config


@cache
def catalog() -> dict[str, Scenario]:
    import scenarios

    return {s.name: s for _, s in discover(scenarios, "SCENARIO", Scenario, lambda s: s.name)}


def get_scenario(name: str) -> Scenario:
    scenarios = catalog()
    if name not in scenarios:
        raise unknown_name("scenario", name, [*scenarios, "all"])
    return scenarios[name]


def parse_scenarios(spec: str) -> list[Scenario]:
    if spec == "all":
        return list(catalog().values())
    return [get_scenario(n.strip()) for n in spec.split(",") if n.strip()]


def model_dtype(model: Model, dtype: torch.dtype) -> torch.dtype:
    """The dtype `model` is loaded in: the scenario's, or float32 for a model kept in it (Wan's VAE)."""
    return torch.float32 if model.dtype == "float32" else dtype

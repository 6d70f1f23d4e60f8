"""Scenarios: the target pipelines built from their true configs with random weights (or loaded for real).

A scenario (`lab.run.definition.Scenario`) names the pipeline class and checkpoint, the call settings, the model
configs at each size and the prompt-embedding shapes. `build(...)` turns a scenario and a size into a :class:`Built`
pipeline plus its call arguments: models with random weights as `from_pretrained` makes them
(`lab.run.faithful`), after a check of the memory it needs (`lab.run.footprint`), the settings turned on after.
This module is the door to them: the lab and the scenarios import these names from `lab.run.scenario`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import io
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lab.base import naming
from lab.base.errors import LabError, UsageError, unknown_name
from lab.run.definition import (SIZES, MissingClass, Model, Scenario, catalog, get_scenario, model_dtype,
                                parse_scenarios, resolve)
from lab.run.faithful import default_dtype_and_device, faithful_model
from lab.run.footprint import Estimate, available_bytes, estimate, fmt_bytes, fmt_params, latent_tokens
from lab.run.footprint import _no_weight_init  # noqa: F401 - its callers took it from here
from lab.run.prompts import randn, random_images, text_embeds, token_mask

if TYPE_CHECKING:
    from lab.run.settings import Guidance

__all__ = ["SIZES", "MissingClass", "Model", "Scenario", "catalog", "get_scenario", "parse_scenarios", "resolve",
           "model_dtype", "default_dtype_and_device", "faithful_model", "Estimate", "available_bytes", "estimate",
           "fmt_bytes", "fmt_params", "latent_tokens", "randn", "random_images", "text_embeds", "token_mask",
           "default_device", "default_size", "default_dtype", "DTYPES", "BUILD", "Built", "setting_target",
           "guidance_of", "attention_mask_of", "build", "output_latents"]
_model_dtype = model_dtype  # its callers took it from here


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_size(device: str) -> str:
    return "full" if device.startswith("cuda") else "tiny"


def default_dtype(device: str) -> torch.dtype:
    # bf16 as upstream on the GPU; fp32 on the CPU, where the tiny models are faster and numerically plain.
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


#: what a scenario's random-weight build guarantees, and records in every result (`Built.build`)
BUILD = "faithful"


@dataclasses.dataclass
class Built:
    """A built pipeline and everything needed to call it the same way again."""

    scenario: Scenario
    pipe: Any
    size: str
    device: str
    dtype: torch.dtype
    layers: int | None
    steps: int
    call_kwargs: dict[str, Any]
    prompt_kwargs: dict[str, Any]
    params: int
    notes: list[str]
    #: how the models were made: "faithful" (as from_pretrained + .to makes them, `faithful_model`) or "pretrained"
    build: str = BUILD
    #: the settings turned on after the build (`lab.run.settings.Setting`, in order)
    chosen_settings: list[Any] = dataclasses.field(default_factory=list)
    #: turns the settings off again (hooks removed, adapters unloaded); None without settings
    undo_settings: Any = None

    @property
    def settings(self) -> list[str]:
        """The settings as the result records them (`first_block_cache (threshold=0.05)`)."""
        return [s.describe() for s in self.chosen_settings]

    @property
    def decodes(self) -> bool:
        """Whether a call decodes to images or video (`--full-decode`, as a user's call does) rather than returning
        latents."""
        return self.call_kwargs.get("output_type") not in (None, "latent")

    @property
    def setting_tags(self) -> tuple[str, ...]:
        """The settings' parts of a result name (`first_block_cache`)."""
        return tuple(s.tag() for s in self.chosen_settings)

    def kwargs(self, seed: int = 0) -> dict[str, Any]:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return {**self.call_kwargs, **self.prompt_kwargs, "generator": generator}

    def __call__(self, seed: int = 0):
        return self.pipe(**self.kwargs(seed))

    def guidance(self) -> Guidance | str:
        """How this pipeline runs classifier-free guidance (`guidance_of`)."""
        return guidance_of(self.scenario)


def setting_target(scenario: Scenario):
    """What `lab.run.settings.check` checks a setting against: the pipeline class and its transformer's class."""
    from lab.run.settings import Target

    model = scenario.models.get(scenario.denoiser)
    if model is None:
        return Target(resolve(scenario.pipeline_cls), None)
    return Target(resolve(scenario.pipeline_cls), resolve(model.cls), scenario.config(scenario.denoiser, "tiny"),
                  second_denoiser=f"{scenario.denoiser}_2" in scenario.models,
                  guidance=functools.partial(guidance_of, scenario),
                  attention_mask=functools.partial(attention_mask_of, scenario))


_GUIDANCE: dict[str, Guidance | str] = {}


_MASKED: dict[str, bool | None] = {}  # whether the denoiser's attention was given a mask (None: the call failed)


def guidance_of(scenario: Scenario) -> Guidance | str:
    """How `scenario`'s pipeline runs classifier-free guidance (`lab.run.settings.Guidance`), or why it could not be
    read: one tiny build and call on the CPU per scenario and process (`_tiny_call`), the denoiser's calls in the
    first step, the batch of the first call and the layout of its output."""
    if scenario.name not in _GUIDANCE:
        _tiny_call(scenario)
    return _GUIDANCE[scenario.name]


def attention_mask_of(scenario: Scenario) -> bool | None:
    """Whether `scenario`'s denoiser gives its attention a mask, read off the same tiny call (`_tiny_call`); None
    where that call could not run."""
    if scenario.name not in _MASKED:
        _tiny_call(scenario)
    return _MASKED[scenario.name]


def _tiny_call(scenario: Scenario) -> None:
    """One tiny build and call of `scenario` on the CPU, with the random state, the thread count and what reaches
    the terminal left as they were: what `guidance_of` and `attention_mask_of` read."""
    from lab.run.settings import Guidance

    seen: list[tuple[int, int]] = []  # (the step's timestep object, the call's batch)
    shapes: list[tuple[int, ...]] = []
    threads = torch.get_num_threads()
    try:  # quietly: what the tiny pipeline prints (a progress bar, warnings) is not the run's
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            built = build(scenario, size="tiny", device="cpu", steps=2)
            pipe = built.pipe
            pipe.set_progress_bar_config(disable=True)
            denoiser = getattr(pipe, scenario.denoiser)

            def before(module, args, kwargs):
                batch = next(v.shape[0] for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
                seen.append((id(getattr(pipe, "_current_timestep", None)), batch))

            def after(module, args, kwargs, output):
                first = output if isinstance(output, torch.Tensor) else output[0]
                shapes.append(tuple(first.shape))

            hooks = [denoiser.register_forward_pre_hook(before, with_kwargs=True),
                     denoiser.register_forward_hook(after, with_kwargs=True)]
            try:
                with _attention_masks_seen() as masked:
                    built()
            finally:
                for hook in hooks:
                    hook.remove()
            channels = denoiser.config.get("out_channels") or denoiser.config.get("in_channels")
    except Exception as e:  # noqa: BLE001 - said as the reason of the refusal
        _GUIDANCE[scenario.name] = f"its tiny build could not be run on the CPU to see ({type(e).__name__}: {e})"
        _MASKED[scenario.name] = None
        return
    finally:
        torch.set_num_threads(threads)
    _MASKED[scenario.name] = bool(masked)
    shape = shapes[0]
    layout = {4: "BCHW"}.get(len(shape))
    if len(shape) == 5:  # channels second (B, C, F, H, W) or third (B, F, C, H, W)
        layout = "BCFHW" if shape[1] == channels and shape[2] != channels else (
            "BFCHW" if shape[2] == channels and shape[1] != channels else None)
    first = seen[0][0]
    if all(step == id(None) for step, _ in seen):  # no step to tell the calls apart by
        _GUIDANCE[scenario.name] = "the pipeline keeps no `current_timestep` during its steps"
    else:
        _GUIDANCE[scenario.name] = Guidance(sum(1 for step, _ in seen if step == first), seen[0][1], layout)


@contextlib.contextmanager
def _attention_masks_seen():
    """A list that holds a True for each call of diffusers' native attention backend given a mask while inside (the
    backend a pipeline runs by default; diffusers looks it up in its registry at every call)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    backends = _AttentionBackendRegistry._backends
    native = backends[AttentionBackendName.NATIVE]
    seen: list[bool] = []

    def recording(*args, **kwargs):
        if kwargs.get("attn_mask") is not None:
            seen.append(True)
        return native(*args, **kwargs)

    backends[AttentionBackendName.NATIVE] = recording
    try:
        yield seen
    finally:
        backends[AttentionBackendName.NATIVE] = native


def _scheduler(scenario: Scenario):
    cls, config = scenario.scheduler
    return resolve(cls)(**config)


def build(
    scenario: Scenario,
    *,
    size: str | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    layers: int | None = None,
    steps: int = 4,
    full_decode: bool = False,
    checkpoint: str | None = None,
    seed: int = 0,
    check_memory: bool = True,
    call: str | None = None,
    settings: Sequence[str] = (),
) -> Built:
    """Build `scenario` at `size` on `device`: random weights from true configs, or the real checkpoint.

    `call` picks the call settings ("full": the checkpoint's, "tiny": small height/width/frames); by default
    "tiny" for the tiny size and "full" otherwise. `settings` (`NAME[:OPTIONS]`, `lab.run.settings`) are checked
    before anything is built and turned on after, in order.
    """
    from lab.run import settings as setting_kinds

    device = device or default_device()
    size = size or default_size(device)
    dtype = dtype or default_dtype(device)
    _check_request(size, steps, device, layers)
    torch.manual_seed(seed)
    pipeline_cls = resolve(scenario.pipeline_cls)
    chosen = setting_kinds.parse_all(list(settings))
    setting_kinds.check(chosen, scenario.name, setting_target(scenario), device)
    notes = []
    if device == "cpu" and size == "tiny" and torch.get_num_threads() > 1:
        # Tiny models gain nothing from intra-op threads, and idle worker threads competing with the Python thread
        # for a few cores make timings jumpy.
        torch.set_num_threads(1)
        notes.append("1 CPU thread for torch (steadier timings of tiny models)")
    if size == "pretrained":
        pipe = _loaded(scenario, pipeline_cls, checkpoint, dtype, device, notes)
    else:
        if check_memory:
            _check_memory(scenario, size, layers, dtype, device)
        pipe = _random_weights(scenario, pipeline_cls, size, layers, dtype, device)
    pipe.set_progress_bar_config(disable=False)
    params = sum(p.numel() for m in pipe.components.values() if isinstance(m, torch.nn.Module) for p in m.parameters())
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    call = call or naming.own_call(size)
    if call not in ("tiny", "full"):
        raise unknown_name("call setting", call, ("tiny", "full"))
    prompt_kwargs = scenario.prompt_inputs(pipe, call, 1, device, dtype, generator)
    call_kwargs = scenario.call_kwargs(call, steps, full_decode)
    built = Built(scenario, pipe, size, device, dtype, layers, steps, call_kwargs, prompt_kwargs, params, notes,
                  "pretrained" if size == "pretrained" else BUILD)
    if chosen:
        built.undo_settings = setting_kinds.apply(chosen, built)
        built.chosen_settings = chosen
        notes.append("settings: " + "; ".join(built.settings))
    return built


def _check_request(size: str, steps: int, device: str, layers: int | None) -> None:
    """Refuse, before anything is built, a size, step count, device or depth that cannot be built."""
    if size not in SIZES:
        raise unknown_name("size", size, SIZES)
    if steps < 1:
        raise UsageError("`--steps` must be at least 1.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("`--device cuda` was asked for, but torch sees no CUDA device here. Use `--device cpu`.")
    if layers is not None and size != "full":
        raise UsageError("`--layers N` keeps the per-layer shapes of `full`; use it with `--size full`.")


def _loaded(scenario: Scenario, pipeline_cls: type, checkpoint: str | None, dtype: torch.dtype, device: str,
            notes: list[str]) -> Any:
    """The real checkpoint (`checkpoint`, else the scenario's), loaded without its text encoders, on `device`."""
    path = checkpoint or scenario.checkpoint
    if not os.path.isdir(path) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UsageError(f"`{path}` is not a local directory and HF_HUB_OFFLINE=1 is set.")
    skip = {k: None for k in inspect.signature(pipeline_cls.__init__).parameters
            if k.startswith(("text_encoder", "tokenizer", "processor"))}
    try:
        pipe = pipeline_cls.from_pretrained(path, torch_dtype=dtype, **skip)
    except (OSError, ValueError) as e:
        raise LabError(f"Could not load `{path}` with {pipeline_cls.__name__}.from_pretrained: "
                       f"{str(e).splitlines()[0]}") from e
    pipe.to(device)
    notes.append(f"loaded {path}")
    return pipe


def _check_memory(scenario: Scenario, size: str, layers: int | None, dtype: torch.dtype, device: str) -> None:
    """Refuse a build whose estimated peak memory is more than `device` has free."""
    est = estimate(scenario, size, layers, dtype)
    free = available_bytes(device)
    if est.peak_bytes > free:
        raise UsageError(
            f"`{scenario.name}` at size `{size}` needs about {fmt_bytes(est.peak_bytes)} "
            f"({fmt_params(est.total_params)} parameters) but {device} has {fmt_bytes(free)} free. "
            "Use `--size tiny`, or `--size full --layers N` for fewer blocks of the true shapes."
        )


def _random_weights(scenario: Scenario, pipeline_cls: type, size: str, layers: int | None, dtype: torch.dtype,
                    device: str) -> Any:
    """The pipeline of random-weight models (`faithful_model`), without its text encoders, moved to `device`."""
    components: dict[str, Any] = {}
    for name, model in scenario.models.items():
        components[name] = faithful_model(resolve(model.cls), scenario.config(name, size, layers),
                                          model_dtype(model, dtype), device)
    components["scheduler"] = _scheduler(scenario)
    accepted = inspect.signature(pipeline_cls.__init__).parameters
    for optional in accepted:  # the text encoders, their tokenizers (SD3 has three of each) and processors
        if optional.startswith(("text_encoder", "tokenizer", "processor")) and optional not in {
                **components, **scenario.pipeline_kwargs}:
            components[optional] = None
    pipe = pipeline_cls(**components, **scenario.pipeline_kwargs)
    pipe.to(device)  # as a user moves a loaded pipeline: parameters and buffers; plain tensors stay
    return pipe


def output_latents(output: Any) -> torch.Tensor:
    """The main output tensor of a pipeline call (`images`/`frames` of the output object)."""
    for attr in ("images", "frames", "videos"):
        value = getattr(output, attr, None)
        if value is not None:
            if isinstance(value, torch.Tensor):
                return value
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
                return torch.stack(list(value))
            import numpy as np

            return torch.from_numpy(np.asarray(value))
    if isinstance(output, tuple):
        return output[0]
    raise LabError(f"Cannot find the output tensor in {type(output).__name__}.")

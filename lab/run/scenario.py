"""Scenarios: the target pipelines built from their true configs with random weights (or loaded for real).

A scenario is one module in `scenarios/` defining `SCENARIO = Scenario(...)`. It names the pipeline class and
checkpoint, the call settings of the upstream profiling harness, the model configs at `full` (true) and `tiny`
size with where each number came from, and the prompt-embedding shapes that stand in for the text encoders.
`build(...)` turns a scenario and a size into a :class:`Built` pipeline plus its call arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import io
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from lab.base import naming
from lab.base.discovery import discover
from lab.base.errors import LabError, UsageError, unknown_name
from lab.run.dtypes import checkpoint_dtype

if TYPE_CHECKING:
    from lab.run.settings import Guidance

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


# --- discovery ----------------------------------------------------------------------------------------------


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


# --- sizes, devices, memory ----------------------------------------------------------------------------------


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_size(device: str) -> str:
    return "full" if device.startswith("cuda") else "tiny"


def default_dtype(device: str) -> torch.dtype:
    # bf16 as upstream on the GPU; fp32 on the CPU, where the tiny models are faster and numerically plain.
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@contextlib.contextmanager
def default_dtype_and_device(dtype: torch.dtype, device: str) -> Iterator[None]:
    """Create parameters directly on `device` in `dtype` (no fp32 detour that doubles memory)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def _model_dtype(model: Model, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if model.dtype == "float32" else dtype


#: what a scenario's random-weight build guarantees, and records in every result (`Built.build`)
BUILD = "faithful"


def faithful_model(cls: type, config: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A model with random weights, as `cls.from_pretrained(checkpoint, torch_dtype=dtype)` followed by
    `.to(device)` gives it, without its checkpoint and without a copy of the weights on the host.

    What `from_pretrained` does (diffusers 0.37.1, `ModelMixin.from_pretrained` and `load_model_dict_into_meta`):
    it constructs the model with `dtype` as torch's default dtype and the parameters on the meta device
    (`accelerate.init_empty_weights()`, buffers included: no), so buffers and tensors kept as plain attributes are
    made on the host by `__init__`; it then loads every state-dict entry (parameters and persistent buffers) in
    `dtype`, or in float32 for a name that `_keep_in_fp32_modules` matches (by dotted part), floating point only;
    non-persistent buffers keep what `__init__` made. The user's `.to(device)` moves parameters and buffers, not
    plain attributes: a plain tensor stays on the host (Qwen-Image's rope frequencies are copied to the device in
    every forward because of it).

    Here: the parameters are made where they will live, on `device` in `dtype` (the module's own init runs there,
    as before: no host copy, no float32 detour of the model). A skeleton of the same config is constructed as
    `from_pretrained` constructs it (meta parameters, host buffers and plain tensors, `dtype` the default), and its
    non-persistent buffers and plain tensors replace the device model's, so that they are the host tensors
    `__init__` makes. Persistent buffers and parameters get the dtype loading gives them. The caller's
    `pipe.to(device)` then moves what a user's moves.
    """
    import accelerate

    with default_dtype_and_device(dtype, device), _defined_empty():
        model = cls(**config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with accelerate.init_empty_weights(include_buffers=False):
            skeleton = cls(**config)
    finally:
        torch.set_default_dtype(previous)

    def loaded_dtype(name: str, tensor: torch.Tensor) -> torch.dtype:
        return checkpoint_dtype(cls, name, tensor, dtype)

    skeleton_modules = dict(skeleton.named_modules())
    for prefix, module in model.named_modules():
        twin = skeleton_modules[prefix]
        for name, param in list(module._parameters.items()):
            if param is not None:
                wanted = loaded_dtype(f"{prefix}.{name}" if prefix else name, param)
                if param.dtype != wanted:
                    module._parameters[name] = torch.nn.Parameter(param.detach().to(wanted),
                                                                  requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if name in module._non_persistent_buffers_set:  # not in a checkpoint: what `__init__` made, on the host
                module._buffers[name] = twin._buffers[name]
            else:  # loaded from the checkpoint: its values, in the dtype loading gives
                module._buffers[name] = buffer.to(loaded_dtype(f"{prefix}.{name}" if prefix else name, buffer))
        for name, value in list(vars(module).items()):
            if name.startswith("_"):
                continue
            if isinstance(value, torch.Tensor) or _holds_tensors(value):
                object.__setattr__(module, name, vars(twin)[name])
    del skeleton
    return model.eval()


@contextlib.contextmanager
def _defined_empty() -> Iterator[None]:
    """`torch.empty` as `torch.zeros` while a model is constructed: a parameter that `__init__` leaves as made (Z-Image's
    pad tokens, which only the checkpoint fills) holds zeros, the same on every build, instead of whatever the memory
    held (a NaN there would reach the output). Initialised parameters are overwritten by their init as before."""
    empty = torch.empty

    def zeros(*args, **kwargs):  # the real `torch.empty`, then filled (torch.zeros may itself call torch.empty)
        tensor = empty(*args, **kwargs)
        return tensor if tensor.is_meta or "out" in kwargs else tensor.zero_()

    torch.empty = zeros
    try:
        yield
    finally:
        torch.empty = empty


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, torch.Tensor) for v in value.values())
    return False


@dataclasses.dataclass(frozen=True)
class Estimate:
    params: dict[str, int]
    weight_bytes: int
    activation_bytes: int

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def peak_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes


def estimate(scenario: Scenario, size: str, layers: int | None, dtype: torch.dtype) -> Estimate:
    """Parameter counts (from models built on the meta device) and a rough peak-memory estimate.

    Activations are estimated as 24 bytes per latent token per hidden unit of the transformer (attention and MLP
    working set of one block at a time); a coarse figure, stated as an estimate wherever it is shown.
    """
    params, weight_bytes = {}, 0
    for name, model in scenario.models.items():
        cls = resolve(model.cls)
        with torch.device("meta"), _no_weight_init():
            module = cls(**scenario.config(name, size, layers))
        named = dict(module.named_parameters())
        params[name] = sum(p.numel() for p in named.values())
        # in the dtypes loading gives them (`_keep_in_fp32_modules` at 4 bytes)
        weight_bytes += sum(p.numel() * checkpoint_dtype(type(module), n, p, _model_dtype(model, dtype)).itemsize
                            for n, p in named.items())
    tokens = latent_tokens(scenario, size)
    hidden = _hidden_size(scenario.config(scenario.denoiser, size, layers))
    return Estimate(params, weight_bytes, 24 * tokens * hidden * max(1, scenario.call.get("_cfg_batch", 2)))


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """`torch.nn.init`'s in-place initializers as no-ops, for models built on the meta device only to be counted: there
    they write nothing, but each call still goes through the device mode's dispatch (some 40 % of `lab scenarios`'
    estimates). Restored on exit, exceptions included."""
    names = [n for n in vars(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, _unchanged)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def _unchanged(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def _hidden_size(config: dict[str, Any]) -> int:
    """The denoiser's width: heads x head size for a transformer, the widest stage for a UNet (its `attention_head_dim`
    is then a list per stage, or absent)."""
    if "block_out_channels" in config or isinstance(config.get("attention_head_dim"), (list, tuple)):
        return int(max(config.get("block_out_channels") or [1280]))
    return int(config.get("num_attention_heads", 24)) * int(config.get("attention_head_dim", 128))


def latent_tokens(scenario: Scenario, size: str) -> int:
    call = scenario.call_for(size)
    h, w = call.get("height", 1024), call.get("width", 1024)
    frames = call.get("num_frames")
    tokens = (h // 16) * (w // 16)
    if frames:
        tokens *= (frames - 1) // 4 + 1
    return tokens


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


# --- building -------------------------------------------------------------------------------------------------


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
    notes = []
    if size not in SIZES:
        raise unknown_name("size", size, SIZES)
    if steps < 1:
        raise UsageError("`--steps` must be at least 1.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("`--device cuda` was asked for, but torch sees no CUDA device here. Use `--device cpu`.")
    if layers is not None and size != "full":
        raise UsageError("`--layers N` keeps the per-layer shapes of `full`; use it with `--size full`.")
    torch.manual_seed(seed)
    pipeline_cls = resolve(scenario.pipeline_cls)
    chosen = setting_kinds.parse_all(list(settings))
    setting_kinds.check(chosen, scenario.name, setting_target(scenario), device)
    if device == "cpu" and size == "tiny" and torch.get_num_threads() > 1:
        # Tiny models gain nothing from intra-op threads, and idle worker threads competing with the Python thread
        # for 2 cores make timings jumpy.
        torch.set_num_threads(1)
        notes.append("1 CPU thread for torch (steadier timings of tiny models)")

    if size == "pretrained":
        path = checkpoint or scenario.checkpoint
        if not os.path.isdir(path) and os.environ.get("HF_HUB_OFFLINE") == "1":
            raise UsageError(f"`{path}` is not a local directory and HF_HUB_OFFLINE=1 is set.")
        skip = {k: None for k in inspect.signature(pipeline_cls.__init__).parameters
                if k.startswith(("text_encoder", "tokenizer", "processor"))}
        try:
            pipe = pipeline_cls.from_pretrained(path, torch_dtype=dtype, **skip)
        except (OSError, ValueError) as e:
            raise LabError(f"Could not load `{path}` with {pipeline_cls.__name__}.from_pretrained: {str(e).splitlines()[0]}") from e
        pipe.to(device)
        notes.append(f"loaded {path}")
    else:
        if check_memory:
            est = estimate(scenario, size, layers, dtype)
            free = available_bytes(device)
            if est.peak_bytes > free:
                raise UsageError(
                    f"`{scenario.name}` at size `{size}` needs about {fmt_bytes(est.peak_bytes)} "
                    f"({fmt_params(est.total_params)} parameters) but {device} has {fmt_bytes(free)} free. "
                    "Use `--size tiny`, or `--size full --layers N` for fewer blocks of the true shapes."
                )
        components: dict[str, Any] = {}
        for name, model in scenario.models.items():
            components[name] = faithful_model(resolve(model.cls), scenario.config(name, size, layers),
                                              _model_dtype(model, dtype), device)
        components["scheduler"] = _scheduler(scenario)
        accepted = inspect.signature(pipeline_cls.__init__).parameters
        for optional in accepted:  # the text encoders, their tokenizers (SD3 has three of each) and processors
            if optional.startswith(("text_encoder", "tokenizer", "processor")) and optional not in {
                    **components, **scenario.pipeline_kwargs}:
                components[optional] = None
        pipe = pipeline_cls(**components, **scenario.pipeline_kwargs)
        pipe.to(device)  # as a user moves a loaded pipeline: parameters and buffers; plain tensors stay
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


def text_embeds(batch: int, seq: int, dim: int, generator, device, dtype, *, negative: bool,
                scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Random stand-ins for a text encoder's output: `prompt_embeds` (and `negative_prompt_embeds`) [B, seq, dim]."""
    out = {"prompt_embeds": randn((batch, seq, dim), generator, device, dtype, scale)}
    if negative:
        out["negative_prompt_embeds"] = randn((batch, seq, dim), generator, device, dtype, scale)
    return out


def token_mask(batch: int, seq: int, tokens: int, device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A tokenizer's attention mask for a prompt of `tokens` tokens padded on the right to `seq`: 1 then 0, [B, seq]."""
    return (torch.arange(seq) < min(tokens, seq)).to(dtype).expand(batch, seq).to(device)


def random_images(height: int, width: int, count: int, generator) -> list:
    """Random RGB PIL images (input frames for image- and video-conditioned pipelines), seeded by `generator`."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(int(generator.initial_seed()) % 2**32)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def randn(shape, generator, device, dtype, scale: float = 1.0) -> torch.Tensor:
    """Random prompt embeddings: drawn on the CPU from `generator` (reproducible on any device), then moved."""
    return (torch.randn(shape, generator=generator) * scale).to(device=device, dtype=dtype)


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

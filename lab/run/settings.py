"""The settings users run: a memory or speed feature of diffusers turned on over a built pipeline, through diffusers'
own public API, the same in both arms (`--setting NAME[:OPTIONS]`).

A setting is parsed from its text (`first_block_cache:threshold=0.2`, `group_offload:leaf_level,stream`,
`attention_backend:flex`, `lora:rank=16,fused`), checked against the scenario and the device before anything is
built (a refusal is one `UsageError` naming the setting, the pipeline and the reason), applied after the build
(`apply`, which returns its undo) and named in the result (`tag`), so that results in different settings never
replace each other. `SETTINGS` is the catalog (`lab settings` prints it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from typing import Any, Callable

from lab.base.errors import UsageError

Undo = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class Target:
    """What a setting is checked against before the build: the pipeline class and its transformer's class."""

    pipeline_cls: type
    transformer_cls: type | None
    #: the transformer's tiny config: a cache is tried on a copy of it made on the meta device (no memory, no
    #: weights), so that one whose hooks would match no module is refused before anything is built
    tiny_config: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Kind:
    """One setting: what it does, its options (name -> default; a bool option is turned on by its bare name, a
    `choice` option takes one of its words bare), and how it is checked and applied."""

    name: str
    does: str
    api: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # option -> its bare words
    accelerator_only: str | None = None  # why it cannot run on a CPU, if it cannot
    check: Callable[[Target, dict], str | None] | None = None  # (what it is turned on for, options) -> why not, or None
    apply: Callable[[Any, dict], Undo] = None  # (the built pipeline, options) -> undo
    positional: str | None = None  # the option a bare word sets (`attention_backend:flex`)
    #: how the output check works in this setting
    verify: str = "outputs bit-identical within the tolerance, as without a setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    kind: Kind
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kind.name

    def tag(self) -> str:
        """The setting in a result name: `first_block_cache`, `group_offload-leaf_level-stream`,
        `first_block_cache-threshold0.2` (options that differ from their default, in the catalog's order)."""
        parts = [self.kind.name]
        for key, default in self.kind.options.items():
            value = self.options[key]
            if value == default:
                continue
            if key in self.kind.choices or key == self.kind.positional:
                parts.append(str(value))
            elif isinstance(default, bool):
                parts.append(key if value else f"no_{key}")
            else:
                parts.append(f"{key}{value}")
        return "-".join(parts)

    def describe(self) -> str:
        """`first_block_cache (threshold=0.2)`: the setting with every option, as the result records it."""
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.kind.name} ({opts})" if opts else self.kind.name


def parse(text: str) -> Setting:
    """`NAME[:OPTIONS]`, OPTIONS comma-separated: `key=value`, a bool option's bare name, or a bare choice word."""
    name, _, rest = text.partition(":")
    kind = SETTINGS.get(name.strip())
    if kind is None:
        raise UsageError(f"Unknown setting `{name}`; choose one of {', '.join(SETTINGS)} (see `lab settings`).")
    options = dict(kind.options)
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            chosen = [opt for opt, words in kind.choices.items() if key in words]
            if chosen:
                options[chosen[0]] = key
                continue
            if isinstance(kind.options.get(key), bool):
                options[key] = True
                continue
            if kind.positional:
                options[kind.positional] = _convert(text, kind.positional, key, kind.options[kind.positional], None)
                continue
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        if key not in kind.options:
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        options[key] = _convert(text, key, value, kind.options[key], kind.choices.get(key))
    return Setting(kind, options)


def _convert(text: str, key: str, value: str, default: Any, words: tuple[str, ...] | None) -> Any:
    if words is not None:
        if value not in words:
            raise UsageError(f"`--setting {text}`: `{key}` is one of {', '.join(words)}, not `{value}`.")
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise UsageError(f"`--setting {text}`: `{key}` takes a {type(default).__name__}, not `{value}`.") from None
    return value


def _option_help(kind: Kind) -> str:
    out = []
    for key, default in kind.options.items():
        words = kind.choices.get(key)
        out.append(f"{'|'.join(words)} (default {default})" if words else f"{key}={default}")
    return ", ".join(out)


def parse_all(texts: list[str] | None) -> list[Setting]:
    """The `--setting` options in order; one setting of each kind, and one cache and one offloading at most."""
    settings = [parse(t) for t in texts or ()]
    seen: dict[str, str] = {}
    for s in settings:
        group = _GROUP.get(s.name, s.name)
        if group in seen:
            raise UsageError(f"`--setting {s.name}` and `--setting {seen[group]}` cannot be combined: diffusers takes "
                             f"one {group} at a time.")
        seen[group] = s.name
    return settings


def check(settings: list[Setting], scenario: str, target: Target, device: str) -> None:
    """Refuse, before anything is built, a setting this pipeline (`target`, of scenario `scenario`) or this device
    cannot take."""
    pipeline_cls = target.pipeline_cls
    for s in settings:
        why = None
        if s.kind.accelerator_only and not device.startswith("cuda"):
            why = s.kind.accelerator_only
        elif s.kind.check is not None:
            why = s.kind.check(target, s.options)
        if why:
            raise UsageError(f"`--setting {s.name}` cannot run on `{scenario}` ({pipeline_cls.__name__}) "
                             f"on {device}: {why}.")


def apply(settings: list[Setting], built: Any) -> Undo:
    """Turn the settings on, in order; the returned function turns them off again in reverse order (hooks removed,
    adapters unloaded, weights and devices as before)."""
    undos: list[Undo] = []

    def undo() -> None:
        while undos:
            undos.pop()()

    try:
        for s in settings:
            try:
                undos.append(s.kind.apply(built, s.options))
            except UsageError as e:
                raise UsageError(f"`--setting {s.name}` cannot run on `{built.scenario.name}`: {e}.") from None
    except Exception:
        undo()
        raise
    return undo


def tags(settings: list[Setting]) -> tuple[str, ...]:
    return tuple(s.tag() for s in settings)


# --- the catalog -------------------------------------------------------------------------------------------------

_GROUP = {**{n: "cache" for n in ("first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache")},
          **{n: "offloading" for n in ("model_cpu_offload", "sequential_cpu_offload", "group_offload")}}

_ON_CPU = "on the CPU the weights already live where they run: there is nothing to offload"


def _repeated_block_classes(transformer: type | None) -> list[type]:
    if transformer is None:
        return []
    module = sys.modules[transformer.__module__]
    return [getattr(module, n) for n in getattr(transformer, "_repeated_blocks", None) or () if hasattr(module, n)]


def _blocks_registered(target: Target, options: dict) -> str | None:
    """The first-block cache hooks the transformer's blocks by their registered metadata."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    blocks = _repeated_block_classes(target.transformer_cls)
    if not blocks:
        return "its transformer names no repeated blocks for the cache to hook"
    for block in blocks:
        try:
            TransformerBlockRegistry.get(block)
        except ValueError:
            return (f"diffusers has no block metadata for `{block.__name__}` (`TransformerBlockRegistry`: "
                    f"`enable_cache` raises `Model class {block.__name__} not registered`)")
    return None


def _current_timestep(pipe: Any) -> Callable[[], Any]:
    return lambda: pipe.current_timestep


def _hooks_nothing(config_name: str, transformer: Any) -> str:
    return (f"`{config_name}` hooks no module of {type(transformer).__name__}: its default module identifiers match "
            "none of this transformer's module names, so `enable_cache` would do nothing (diffusers says nothing "
            "either)")


def _cache_probe(config_name: str, make: Callable[[Any, dict], dict], then: Callable | None = None) -> Callable:
    """A cache's check: `then` (if any), and the cache turned on over the transformer made on the meta device from
    its tiny config; refused if no hook lands on a module."""
    def check_cache(target: Target, options: dict) -> str | None:
        why = then(target, options) if then is not None else None
        if why or target.transformer_cls is None or target.tiny_config is None:
            return why
        import types

        import diffusers.hooks as hooks
        import torch

        try:
            with torch.device("meta"):
                transformer = target.transformer_cls(**target.tiny_config)
            transformer.enable_cache(getattr(hooks, config_name)(**make(types.SimpleNamespace(current_timestep=None),
                                                                       options)))
        except Exception:  # noqa: BLE001 - a model that cannot be made on the meta device is checked once built
            return None
        return None if hook_count(transformer) else _hooks_nothing(config_name, transformer)

    return check_cache


def _cache(config_name: str, make: Callable[[Any, dict], dict]) -> Callable:
    def apply_cache(built: Any, options: dict) -> Undo:
        import diffusers.hooks as hooks

        transformer = built.pipe.transformer
        config = getattr(hooks, config_name)(**make(built.pipe, options))
        before = hook_count(transformer)
        transformer.enable_cache(config)
        if hook_count(transformer) == before:  # where the check could not try it on the meta device
            transformer.disable_cache()
            raise UsageError(_hooks_nothing(config_name, transformer))
        return transformer.disable_cache

    return apply_cache


def _lora_check(target: Target, options: dict) -> str | None:
    if not hasattr(target.pipeline_cls, "load_lora_weights"):
        return "the pipeline has no `load_lora_weights`"
    if importlib.util.find_spec("peft") is None:
        return "PEFT is not installed (`pip install peft`)"
    if options["rank"] < 1:
        return f"the rank must be at least 1, not {options['rank']}"
    return None


#: attention projections a LoRA targets, as diffusers' training scripts name them
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def _lora_apply(built: Any, options: dict) -> Undo:
    """A random LoRA of the given rank on the transformer's attention projections, loaded as a user loads one:
    `pipe.load_lora_weights(state_dict, adapter_name=...)` (PEFT), fused into the weights with `fused`."""
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = built.pipe
    transformer = pipe.transformer
    targets = sorted({name.rsplit(".", 1)[-1] if not name.endswith("to_out.0") else "to_out.0"
                      for name, m in transformer.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)})
    if not targets:
        raise UsageError(f"`--setting lora`: the transformer of {type(pipe).__name__} has no attention projection "
                         f"named {', '.join(LORA_TARGETS)}.")
    # fusing adds B·A into the weights and unfusing subtracts it again, which does not give back the same bits: the
    # undo puts back a host copy of the projections' weights taken before
    saved = {name: m.weight.detach().to("cpu", copy=True) for name, m in transformer.named_modules()
             if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)} if options["fused"] else {}
    # make the adapter's weights with PEFT on the transformer itself (random A and B: `init_lora_weights=False`),
    # take its state dict, and remove it again: what a trained LoRA file holds
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(options["seed"])
    transformer.add_adapter(LoraConfig(r=options["rank"], lora_alpha=options["rank"], target_modules=targets,
                                       init_lora_weights=False), adapter_name="lab_make")
    torch.random.set_rng_state(generator_state)
    state = {f"transformer.{k}": v.detach().to("cpu", torch.float32).clone()
             for k, v in get_peft_model_state_dict(transformer, adapter_name="lab_make").items()}
    transformer.delete_adapters("lab_make")
    pipe.load_lora_weights(state, adapter_name="lab")
    if options["fused"]:
        pipe.fuse_lora(components=["transformer"], lora_scale=options["scale"])
    else:
        pipe.set_adapters(["lab"], adapter_weights=[options["scale"]])

    def undo() -> None:
        if options["fused"]:
            pipe.unfuse_lora(components=["transformer"])
        pipe.unload_lora_weights()
        modules = dict(transformer.named_modules())
        with torch.no_grad():
            for name, weight in saved.items():
                modules[name].weight.copy_(weight)

    return undo


def _offload(method: str) -> Callable:
    def apply_offload(built: Any, options: dict) -> Undo:
        getattr(built.pipe, method)(device=built.device)

        def undo() -> None:
            built.pipe.remove_all_hooks()
            built.pipe.to(built.device)

        return undo

    return apply_offload


def _group_offload(built: Any, options: dict) -> Undo:
    import torch

    pipe, device = built.pipe, built.device
    kwargs = {"onload_device": torch.device(device), "offload_device": torch.device("cpu"),
              "offload_type": options["level"], "use_stream": options["stream"],
              "non_blocking": options["stream"]}
    if options["level"] == "block_level":
        kwargs["num_blocks_per_group"] = options["blocks"]
    snapshots = [_hook_snapshot(c) for c in pipe.components.values() if isinstance(c, torch.nn.Module)]
    pipe.enable_group_offload(**kwargs)

    def undo() -> None:
        for snapshot in snapshots:
            _restore_hooks(snapshot)
        pipe.to(device)

    return undo


def _layerwise_casting(built: Any, options: dict) -> Undo:
    """Transformer weights stored in float8 (e4m3fn by default) and cast to the compute dtype per layer. The cast
    loses precision, so the undo puts back a copy of the weights taken before."""
    import torch

    transformer = built.pipe.transformer
    # on the host: a copy on the device would hold the memory that float8 storage is meant to free
    saved = {k: v.detach().to("cpu", copy=True) for k, v in transformer.state_dict().items()}
    hooks = _hook_snapshot(transformer)
    transformer.enable_layerwise_casting(storage_dtype=getattr(torch, options["storage"]), compute_dtype=built.dtype)

    def undo() -> None:
        # diffusers cannot remove this hook (`LayerwiseCastingHook does not support deinitialization`): the modules'
        # forwards and hook registries go back to what they were, and the weights to the copy
        _restore_hooks(hooks)
        with torch.no_grad():
            for k, v in transformer.state_dict(keep_vars=True).items():
                original = saved[k]
                v.data = original.to(v.device)

    return undo


def _hook_snapshot(model: Any) -> list[tuple[Any, Any, Any, tuple]]:
    """Each module's own `forward` attribute and diffusers hook registry (with its hooks, in order), to put back."""
    out = []
    for module in model.modules():
        registry = module.__dict__.get("_diffusers_hook")
        state = (dict(registry.hooks), list(registry._hook_order), list(registry._fn_refs)) if registry else ()
        out.append((module, module.__dict__.get("forward"), registry, state))
    return out


def _restore_hooks(snapshot: list[tuple[Any, Any, Any, tuple]]) -> None:
    for module, forward, registry, state in snapshot:
        for attr, value in (("forward", forward), ("_diffusers_hook", registry)):
            if value is None:
                module.__dict__.pop(attr, None)
            else:
                module.__dict__[attr] = value
        if registry is not None:
            registry.hooks, registry._hook_order, registry._fn_refs = dict(state[0]), list(state[1]), list(state[2])


def hook_count(model: Any) -> int:
    """How many diffusers hooks are registered on the modules of `model`."""
    return sum(len(m.__dict__["_diffusers_hook"].hooks) for m in model.modules() if "_diffusers_hook" in m.__dict__)


def _storage_check(target: Target, options: dict) -> str | None:
    import torch

    if not hasattr(torch, options["storage"]):
        return f"this torch has no dtype `{options['storage']}`"
    return None


def _attention_check(target: Target, options: dict) -> str | None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    try:
        backend = AttentionBackendName(options["backend"])
    except ValueError:
        return (f"diffusers has no attention backend `{options['backend']}` "
                f"(it has {', '.join(b.value for b in AttentionBackendName)})")
    try:
        _check_attention_backend_requirements(backend)
    except (RuntimeError, ImportError, ValueError) as e:
        return str(e).splitlines()[0].rstrip(".")
    return None


def _attention_apply(built: Any, options: dict) -> Undo:
    built.pipe.transformer.set_attention_backend(options["backend"])
    return built.pipe.transformer.reset_attention_backend


SETTINGS: dict[str, Kind] = {k.name: k for k in [
    Kind("first_block_cache", "skip the transformer's other blocks when the first block's residual changed little "
         "since the last step (a decision on the host per forward)", "transformer.enable_cache(FirstBlockCacheConfig)",
         options={"threshold": 0.05},
         check=_cache_probe("FirstBlockCacheConfig", lambda pipe, o: {"threshold": o["threshold"]}, _blocks_registered),
         apply=_cache("FirstBlockCacheConfig", lambda pipe, o: {"threshold": o["threshold"]}),
         verify="the cache decides per forward from the data, and starts afresh in every call: two calls of one arm "
                "give the same output (tests/test_settings.py), so the arms are compared as without a setting; a fix "
                "that moves a residual across the threshold changes a decision and shows as outputs differ"),
    Kind("pyramid_attention_broadcast", "reuse attention outputs every N steps inside a timestep range (PAB)",
         "transformer.enable_cache(PyramidAttentionBroadcastConfig)",
         options={"skip_range": 2},
         check=_cache_probe("PyramidAttentionBroadcastConfig", lambda pipe, o: {
             "spatial_attention_block_skip_range": o["skip_range"],
             "current_timestep_callback": _current_timestep(pipe)}),
         apply=_cache("PyramidAttentionBroadcastConfig", lambda pipe, o: {
             "spatial_attention_block_skip_range": o["skip_range"],
             "current_timestep_callback": _current_timestep(pipe)})),
    Kind("taylorseer_cache", "predict block outputs from a Taylor series of earlier steps (TaylorSeer)",
         "transformer.enable_cache(TaylorSeerCacheConfig)",
         options={"interval": 5},
         check=_cache_probe("TaylorSeerCacheConfig", lambda pipe, o: {"cache_interval": o["interval"]}),
         apply=_cache("TaylorSeerCacheConfig", lambda pipe, o: {"cache_interval": o["interval"]})),
    Kind("model_cpu_offload", "each model on the accelerator only while it runs, else on the host",
         "pipe.enable_model_cpu_offload()", accelerator_only=_ON_CPU, apply=_offload("enable_model_cpu_offload")),
    Kind("sequential_cpu_offload", "every leaf module's weights copied to the accelerator for its own forward",
         "pipe.enable_sequential_cpu_offload()", accelerator_only=_ON_CPU,
         apply=_offload("enable_sequential_cpu_offload")),
    Kind("group_offload", "groups of blocks (or leaf modules) onloaded for their forward, optionally on a side stream",
         "pipe.enable_group_offload(...)", options={"level": "block_level", "blocks": 1, "stream": False},
         choices={"level": ("block_level", "leaf_level")}, accelerator_only=_ON_CPU, apply=_group_offload),
    Kind("layerwise_casting", "transformer weights stored in float8, cast to the compute dtype layer by layer",
         "transformer.enable_layerwise_casting(storage_dtype, compute_dtype)",
         options={"storage": "float8_e4m3fn"}, choices={"storage": ("float8_e4m3fn", "float8_e5m2")},
         check=_storage_check, apply=_layerwise_casting),
    Kind("attention_backend", "attention through another kernel (native SDPA, flash, cuDNN, flex, sage, ...)",
         "transformer.set_attention_backend(name)", options={"backend": "native"},
         check=_attention_check, apply=_attention_apply, positional="backend"),
    Kind("lora", "a random LoRA on the attention projections, loaded with the pipeline's `load_lora_weights` (PEFT)",
         "pipe.load_lora_weights(...); fused: pipe.fuse_lora()",
         options={"rank": 16, "scale": 1.0, "fused": False, "seed": 0}, check=_lora_check, apply=_lora_apply),
]}

"""The settings users run: a memory or speed feature of diffusers turned on over a built pipeline, through diffusers'
own public API, the same in both arms (`--setting NAME[:OPTIONS]`).

A setting is parsed from its text (`first_block_cache:threshold=0.2`, `group_offload:leaf_level,stream`,
`attention_backend:flex`, `lora:rank=16,fused`), checked against the scenario and the device before anything is
built (a refusal is one `UsageError` naming the setting, the pipeline and the reason), applied after the build
(`apply`, which returns its undo) and named in the result (`tag`), so that results in different settings never
replace each other. `SETTINGS` is the catalog (`lab settings` prints it).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.util
import math
from typing import Any, Callable, ContextManager, Iterator

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
    #: the pipeline hands some steps to a second denoiser (Wan 2.2's `transformer_2`), which a setting does not reach
    second_denoiser: bool = False
    #: how the pipeline runs classifier-free guidance, read off its tiny build when first asked
    #: (`lab.run.scenario.guidance_of`); None: not known
    guidance: Callable[[], Guidance | str] | None = None
    #: whether the denoiser gives its attention a mask, read off the same tiny call (`lab.run.scenario.
    #: attention_mask_of`; None: not known)
    attention_mask: Callable[[], bool | None] | None = None


@dataclasses.dataclass(frozen=True)
class Range:
    """The values diffusers takes for a numeric option, `low` to `high` (None: no bound), and why: what its code
    does with the option (a block cache computes every N-th call by `iteration % N`, so N must be at least 1)."""

    low: float | None = None
    high: float | None = None
    why: str = ""

    def __contains__(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        return (f"{'(-inf' if self.low is None else f'[{self.low:g}'}, "
                f"{'inf)' if self.high is None else f'{self.high:g}]'}")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One setting: what it does, its options (name -> default; a bool option is turned on by its bare name, a
    `choice` option takes one of its words bare), and how it is checked and applied."""

    name: str
    does: str
    api: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # option -> its bare words
    #: numeric option -> the values diffusers takes (any finite number where an option has none)
    ranges: dict[str, Range] = dataclasses.field(default_factory=dict)
    accelerator_only: str | None = None  # why it cannot run on a CPU, if it cannot
    #: (options, device) -> why these options cannot run on this device, or None (`quantized:float8dq` needs sm_89)
    device_check: Callable[[dict, str], str | None] | None = None
    #: (options) -> what this host lacks for it (a package), or None: asked where it runs, not where a campaign file
    #: is planned (a GPU host may have what the planning machine does not)
    host_check: Callable[[dict], str | None] | None = None
    check: Callable[[Target, dict], str | None] | None = None  # (what it is turned on for, options) -> why not, or None
    apply: Callable[[Any, dict], Undo] = None  # (the built pipeline, options) -> undo
    positional: str | None = None  # the option a bare word sets (`attention_backend:flex`)
    #: how the output check works in this setting
    verify: str = "outputs bit-identical within the tolerance, as without a setting"
    #: () -> a context in which the setting's decisions from the data are counted (a cache that skips work when
    #: what it reads changed little): what each arm's verifying call decided, so that a page says whether the cache
    #: skipped at all (with random weights it may never)
    decides: Callable[[], ContextManager[collections.Counter]] | None = None


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
    given: dict[str, str] = {}  # option -> the item that set it: an option is given once

    def put(option: str, value: Any, item: str) -> None:
        if option in given:
            raise UsageError(f"`--setting {text}`: `{option}` is given twice (`{given[option]}`, `{item}`); give it "
                             "once.")
        given[option] = item
        options[option] = value

    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            chosen = [opt for opt, words in kind.choices.items() if key in words]
            if chosen:
                put(chosen[0], key, item)
                continue
            if isinstance(kind.options.get(key), bool):
                put(key, True, item)
                continue
            if kind.positional:
                put(kind.positional, _convert(text, kind, kind.positional, key), item)
                continue
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        if key not in kind.options:
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        put(key, _convert(text, kind, key, value), item)
    return Setting(kind, options)


def _convert(text: str, kind: Kind, key: str, value: str) -> Any:
    """The option's value from its text, checked: one of its words, a bool, or a finite number in the range
    diffusers takes (`Kind.ranges`), so that nothing diffusers would refuse, or take and do nothing sensible with,
    reaches a build."""
    default, words = kind.options[key], kind.choices.get(key)
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
            number: Any = int(value)
        elif isinstance(default, float):
            number = float(value)
        else:
            return value
    except ValueError:
        raise UsageError(f"`--setting {text}`: `{key}` takes a {type(default).__name__}, not `{value}`.") from None
    accepted = kind.ranges.get(key, Range())
    if not math.isfinite(number) or number not in accepted:
        why = f" ({accepted.why})" if accepted.why else ""
        raise UsageError(f"`--setting {text}`: `{key}` takes a finite {type(default).__name__} in {accepted}{why}, "
                         f"not `{value}`.")
    return number


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


def refusal(setting: Setting, target: Target, device: str | None) -> str | None:
    """Why `setting` cannot run on this pipeline (`target`) and, unless `device` is None, on this device; None if it
    can. With `device=None` only what the pipeline decides is asked (a campaign file planned on another machine)."""
    if device is not None and setting.kind.accelerator_only and not device.startswith("cuda"):
        return setting.kind.accelerator_only
    why = setting.kind.check(target, setting.options) if setting.kind.check is not None else None
    if not why and device is not None and setting.kind.host_check is not None:
        why = setting.kind.host_check(setting.options)
    if not why and device is not None and setting.kind.device_check is not None:
        why = setting.kind.device_check(setting.options, device)
    return why


def check(settings: list[Setting], scenario: str, target: Target, device: str) -> None:
    """Refuse, before anything is built, a setting this pipeline (`target`, of scenario `scenario`) or this device
    cannot take."""
    pipeline_cls = target.pipeline_cls
    for s in settings:
        why = refusal(s, target, device)
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


#: the prefix of a decision's count among a verifying call's counts (`first_block_cache: skipped`)
DECIDED = "decided by "


@contextlib.contextmanager
def decisions(settings: list[Setting]) -> Iterator[dict[str, int]]:
    """Count the decisions of every setting in `settings` that makes them from the data (`Kind.decides`) while the
    block runs; the dict holds `decided by first_block_cache: computed` and `...: skipped` when it ends."""
    counted: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        deciding = [(s.name, stack.enter_context(s.kind.decides())) for s in settings if s.kind.decides]
        yield counted
        for name, counts in deciding:
            counted.update({f"{DECIDED}{name}: {what}": n for what, n in sorted(counts.items())})


@contextlib.contextmanager
def _first_block_decisions() -> Iterator[collections.Counter]:
    """The first-block cache's decisions: transformer calls that ran every block (`computed`) and those that skipped
    the rest (`skipped`), counted at `FBCHeadBlockHook._should_compute_remaining_blocks`, whatever implements it then
    (a fix's rewrite included). The decision is a host bool by then, so counting it costs no sync."""
    import torch
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    counts: collections.Counter = collections.Counter({"computed": 0, "skipped": 0})
    decide = FBCHeadBlockHook.__dict__["_should_compute_remaining_blocks"]

    @torch.compiler.disable
    def counted(self, *args, **kwargs):
        compute = decide(self, *args, **kwargs)
        counts["computed" if compute else "skipped"] += 1
        return compute

    FBCHeadBlockHook._should_compute_remaining_blocks = counted
    try:
        yield counts
    finally:
        FBCHeadBlockHook._should_compute_remaining_blocks = decide


def tags(settings: list[Setting]) -> tuple[str, ...]:
    return tuple(s.tag() for s in settings)


def without(settings: list[Setting], built: Any, call: Callable[[], Any]) -> Any:
    """`call()` with `settings` turned off, then on again as the build turned them on (`built.undo_settings` is the
    new undo): what the pipeline gives without them. Only cache hooks, whose hooks are made again the same
    (MagCache measures its ratios with calls, a LoRA's or quantization's weights would be made anew): None for any
    other setting, and None without settings."""
    if not settings or built.undo_settings is None or any(s.name not in _REMADE_EXACTLY for s in settings):
        return None
    built.undo_settings()
    try:
        return call()
    finally:
        built.undo_settings = apply(settings, built)


# --- the catalog -------------------------------------------------------------------------------------------------

_CACHES = ("first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache", "mag_cache", "faster_cache")
#: the settings that turning off and on again makes exactly as before (`without`)
_REMADE_EXACTLY = ("first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache", "faster_cache")
_GROUP = {**{n: "cache" for n in _CACHES},
          **{n: "offloading" for n in ("model_cpu_offload", "sequential_cpu_offload", "group_offload")}}

_ON_CPU = "on the CPU the weights already live where they run: there is nothing to offload"


def _block_classes(target: Target) -> list[type] | None:
    """The classes of the blocks a block cache hooks, found as diffusers finds them (`apply_first_block_cache`,
    `apply_mag_cache`): the children of the transformer named in `_ALL_TRANSFORMER_BLOCK_IDENTIFIERS` that are module
    lists, on the transformer made on the meta device from its tiny config. None: it could not be made there."""
    if target.transformer_cls is None or target.tiny_config is None:
        return None
    import torch
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    try:
        with torch.device("meta"):
            transformer = target.transformer_cls(**target.tiny_config)
    except Exception:  # noqa: BLE001 - a model that cannot be made on the meta device is checked once built
        return None
    return list(dict.fromkeys(type(block) for name, child in transformer.named_children()
                              if name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS and isinstance(child, torch.nn.ModuleList)
                              for block in child))


def _blocks_registered(target: Target, options: dict) -> str | None:
    """A block cache hooks the transformer's blocks by their registered metadata."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    blocks = _block_classes(target)
    if blocks is None:
        return None
    if not blocks:
        return "its transformer holds no list of blocks under a name diffusers' block caches look for"
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
        if target.transformer_cls is not None and not hasattr(target.transformer_cls, "enable_cache"):
            return f"{target.transformer_cls.__name__} has no `enable_cache` (it is not a `CacheMixin`)"
        why = then(target, options) if then is not None else None
        if why or target.transformer_cls is None or target.tiny_config is None:
            return why
        import types

        import diffusers.hooks as hooks
        import torch
        from diffusers.utils import logging as diffusers_logging

        # diffusers' warnings here (FasterCache's "purely experimental feature") are the real apply's to give, once,
        # not this probe's: a campaign checks every cell and would repeat them per cell
        verbosity = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()
        try:
            with torch.device("meta"):
                transformer = target.transformer_cls(**target.tiny_config)
            transformer.enable_cache(getattr(hooks, config_name)(**make(types.SimpleNamespace(current_timestep=None),
                                                                       options)))
        except Exception:  # noqa: BLE001 - a model that cannot be made on the meta device is checked once built
            return None
        finally:
            diffusers_logging.set_verbosity(verbosity)
        return None if hook_count(transformer) else _hooks_nothing(config_name, transformer)

    return check_cache


def _cache(config_name: str, make: Callable[[Any, dict], dict]) -> Callable:
    """A cache's apply: `config_name(**make(built, options))` turned on over the denoiser, refused if it hooks
    nothing."""
    def apply_cache(built: Any, options: dict) -> Undo:
        import diffusers.hooks as hooks

        transformer = getattr(built.pipe, built.scenario.denoiser)
        config = getattr(hooks, config_name)(**make(built, options))
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
    return None


#: attention projections a LoRA targets, as diffusers' training scripts name them
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def _lora_apply(built: Any, options: dict) -> Undo:
    """A random LoRA of the given rank on the transformer's attention projections, loaded as a user loads one:
    `pipe.load_lora_weights(state_dict, adapter_name=...)` (PEFT), fused into the weights with `fused`."""
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe, component = built.pipe, built.scenario.denoiser  # `transformer`, or `unet` (SDXL)
    transformer = getattr(pipe, component)
    targets = sorted({name.rsplit(".", 1)[-1] if not name.endswith("to_out.0") else "to_out.0"
                      for name, m in transformer.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)})
    if not targets:
        raise UsageError(f"`--setting lora`: the {component} of {type(pipe).__name__} has no attention projection "
                         f"named {', '.join(LORA_TARGETS)}.")
    # fusing adds B·A into the weights and unfusing subtracts it again, which does not give back the same bits: the
    # undo puts back a host copy of the projections' weights taken before
    saved = {name: m.weight.detach().to("cpu", copy=True) for name, m in transformer.named_modules()
             if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)} if options["fused"] else {}
    # PEFT freezes every base parameter and leaves them frozen when the adapter is unloaded, which picks another CPU
    # `linear` path (SDXL's outputs moved by 7e-6): the undo gives the flags back, and drops what PEFT set on the model
    grads = [(p, p.requires_grad) for p in transformer.parameters()]
    attrs = dict(vars(transformer))
    # make the adapter's weights with PEFT on the transformer itself (random A and B: `init_lora_weights=False`),
    # take its state dict, and remove it again: what a trained LoRA file holds
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(options["seed"])
    transformer.add_adapter(LoraConfig(r=options["rank"], lora_alpha=options["rank"], target_modules=targets,
                                       init_lora_weights=False), adapter_name="lab_make")
    torch.random.set_rng_state(generator_state)
    state = {f"{component}.{k}": v.detach().to("cpu", torch.float32).clone()
             for k, v in get_peft_model_state_dict(transformer, adapter_name="lab_make").items()}
    transformer.delete_adapters("lab_make")
    pipe.load_lora_weights(state, adapter_name="lab")
    if options["fused"]:
        pipe.fuse_lora(components=[component], lora_scale=options["scale"])
    else:
        pipe.set_adapters(["lab"], adapter_weights=[options["scale"]])

    def undo() -> None:
        if options["fused"]:
            pipe.unfuse_lora(components=[component])
        pipe.unload_lora_weights()
        modules = dict(transformer.named_modules())
        with torch.no_grad():
            for name, weight in saved.items():
                modules[name].weight.copy_(weight)
        for param, flag in grads:
            param.requires_grad_(flag)
        for key in set(vars(transformer)) - set(attrs):
            del vars(transformer)[key]

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
              "non_blocking": options["stream"], "record_stream": options["record_stream"]}
    if options["level"] == "block_level":
        kwargs["num_blocks_per_group"] = options["blocks"]
    snapshots = [_hook_snapshot(c) for c in pipe.components.values() if isinstance(c, torch.nn.Module)]
    pipe.enable_group_offload(**kwargs)

    def undo() -> None:
        for snapshot in snapshots:
            _restore_hooks(snapshot)
        pipe.to(device)

    return undo


def _group_offload_check(target: Target, options: dict) -> str | None:
    # record_stream spares each group's offload its wait for the compute stream (`_offload_to_memory`), a sync per
    # group and call; it marks the weights used on that stream, so there must be a side stream to begin with
    if options["record_stream"] and not options["stream"]:
        return "`record_stream` marks the onloaded weights as used by the compute stream, so it needs `stream`"
    return None


def _layerwise_casting(built: Any, options: dict) -> Undo:
    """Transformer weights stored in float8 (e4m3fn by default) and cast to the compute dtype per layer. The cast
    loses precision, so the undo puts back a copy of the weights taken before."""
    import torch

    transformer = getattr(built.pipe, built.scenario.denoiser)
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
    refusal = masks_refused(backend)
    if refusal and target.attention_mask is not None and target.attention_mask():
        return (f"its transformer's attention is given a mask, which the `{backend.value}` backend does not take "
                f"(diffusers raises \"{refusal}\" at the first attention call)")
    return None


def masks_refused(backend: Any) -> str | None:
    """diffusers' own error when the attention `backend` is given a mask, read off its registered function's source
    (`if attn_mask is not None: raise ValueError(...)`); None when it takes one, or when the source cannot say."""
    import ast
    import inspect
    import re

    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    try:
        source = inspect.getsource(_AttentionBackendRegistry._backends[backend])
    except (KeyError, OSError, TypeError):
        return None
    found = re.search(r"if attn_mask is not None:\s*raise ValueError\((?P<message>\"[^\"\n]*\")\)", source)
    return ast.literal_eval(found["message"]) if found else None


def _attention_apply(built: Any, options: dict) -> Undo:
    denoiser = getattr(built.pipe, built.scenario.denoiser)
    denoiser.set_attention_backend(options["backend"])
    return denoiser.reset_attention_backend


def _mag_options(built: Any, options: dict) -> dict:
    return {"threshold": options["threshold"], "max_skip_steps": options["max_skip"],
            "retention_ratio": options["retention"], "num_inference_steps": built.steps}


def _mag_cache_check(target: Target, options: dict) -> str | None:
    if options["ratios"] == "flux" and target.transformer_cls is not None \
            and target.transformer_cls.__name__ != "FluxTransformer2DModel":
        return (f"`ratios=flux` are FLUX.1's published ratios (`FLUX_MAG_RATIOS`), not "
                f"{target.transformer_cls.__name__}'s; leave `ratios=measured` (the default) to calibrate this "
                "pipeline's own")
    if target.second_denoiser:
        return ("MagCache counts the call's steps on the one transformer it hooks, and this pipeline hands its late "
                "steps to a second expert (`transformer_2`): the hooked one never reaches its last step, so the "
                "calibration never reports and the skips never line up with the steps")
    return _cache_probe("MagCacheConfig", lambda pipe, o: {"calibrate": True}, _blocks_registered)(target, options)


def _mag_cache_kwargs(built: Any, options: dict) -> dict:
    """MagCache with the checkpoint's ratios: FLUX.1's published ones (`ratios=flux`), or, as diffusers documents for
    any other model, measured by one call in calibration mode on this very pipeline (`ratios=measured`)."""
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    ratios = FLUX_MAG_RATIOS if options["ratios"] == "flux" else _mag_ratios_measured(built, options)
    return {**_mag_options(built, options), "mag_ratios": ratios}


def _mag_ratios_measured(built: Any, options: dict) -> list[float]:
    """What a user copies from MagCache's calibration run (`MagCacheConfig(calibrate=True)`, one call, no skipping):
    the ratios it reports at the end of the call, read from its log record (the first context's, the conditional
    one where the pipeline runs CFG as two calls)."""
    import ast
    import contextlib
    import io
    import logging

    from diffusers.hooks import MagCacheConfig

    logger = logging.getLogger("diffusers.hooks.mag_cache")
    reports: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: reports.append(record.getMessage())
    transformer = getattr(built.pipe, built.scenario.denoiser)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    transformer.enable_cache(MagCacheConfig(calibrate=True, **_mag_options(built, options)))
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints them too
            built()
    finally:
        transformer.disable_cache()
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
    prefix = "MagCache Calibration Results: "
    found = [r.removeprefix(prefix) for r in reports if r.startswith(prefix)]
    if not found:
        raise UsageError("MagCache's calibration call reported no ratios: the hooked transformer did not run the "
                         f"call's {built.steps} steps")
    return [float(r) for r in ast.literal_eval(found[0])]


@dataclasses.dataclass(frozen=True)
class Guidance:
    """How a pipeline runs classifier-free guidance, read off one call of its tiny build on the CPU: the denoiser's
    calls in the first step, the batch of the first call, and the layout of its output."""

    calls_per_step: int
    batch: int
    layout: str | None  # "BCHW", "BCFHW", "BFCHW" (FasterCache's names), or None: another shape (a token sequence)

    @property
    def kind(self) -> str:
        if self.calls_per_step > 1:
            return "separate"  # one denoiser call per branch
        return "batched" if self.batch > 1 else "none"


def _faster_cache_check(target: Target, options: dict) -> str | None:
    if target.guidance is None:
        return None
    guidance = target.guidance()
    if isinstance(guidance, str):
        return guidance
    if guidance.kind == "separate":
        return ("FasterCache keeps one state per hooked module, not one per guidance branch, and this pipeline calls "
                "the transformer once per branch: the unconditional call would take the conditional call's cached "
                "attention (and, not guidance-distilled, the denoiser hook would split a batch of one in two)")
    if guidance.kind == "batched" and guidance.layout is None:
        return ("its transformer returns a token sequence, not a latent grid, and FasterCache approximates the "
                "unconditional branch in the frequency domain of a BCHW, BCFHW or BFCHW grid only")
    return None


def _pab_check(target: Target, options: dict) -> str | None:
    """Pyramid attention broadcast keeps one cache per hooked attention module (`PyramidAttentionBroadcastHook`), and
    counts every call of the module as one iteration: in a pipeline that calls the transformer once per guidance
    branch, the unconditional call of a step is the odd iteration, which (inside the timestep range, at the default
    skip range 2) always returns the attention output the conditional call just cached."""
    if target.guidance is None:
        return None
    guidance = target.guidance()
    if isinstance(guidance, str) or guidance.kind != "separate":
        return None  # a pipeline whose guidance could not be read is tried as it is (the probe below still runs)
    return ("pyramid attention broadcast keeps one cache per hooked attention module, not one per guidance branch, "
            "and this pipeline calls the transformer once per branch: inside the timestep range the unconditional "
            "call takes the attention output the conditional call cached (diffusers' `PyramidAttentionBroadcastHook`"
            ".new_forward), which fails where the branches' prompt lengths differ (Qwen-Image) and mixes the branches "
            "where they do not (Wan)")


def _faster_cache_kwargs(built: Any, options: dict) -> dict:
    """The diffusers docs' FasterCache example (CogVideoX) with this pipeline's guidance: guidance-distilled (no
    unconditional branch to skip) when the pipeline runs none, its output layout when it batches the two branches."""
    guidance = built.guidance()
    if isinstance(guidance, str):  # what the check would have said, had it been asked before the build
        raise UsageError(guidance)
    return {**_faster_cache_options(built.pipe, options), "is_guidance_distilled": guidance.kind == "none",
            "tensor_format": guidance.layout or "BCHW"}


def _faster_cache_options(pipe: Any, options: dict) -> dict:
    return {"spatial_attention_block_skip_range": options["skip_range"],
            "spatial_attention_timestep_skip_range": (-1, 681), "current_timestep_callback": _current_timestep(pipe),
            "attention_weight_callback": lambda _: options["weight"],
            "unconditional_batch_skip_range": options["uncond_skip_range"],
            "unconditional_batch_timestep_skip_range": (-1, 781)}


#: `quantized:TYPE`: the torchao config each type names (the configs `TorchAoConfig` takes; diffusers 0.37.1's own
#: string names call torchao functions that torchao 0.18 no longer has)
QUANT_TYPES = {"int8wo": "Int8WeightOnlyConfig", "int8dq": "Int8DynamicActivationInt8WeightConfig",
               "float8wo": "Float8WeightOnlyConfig", "float8dq": "Float8DynamicActivationFloat8WeightConfig"}


def _installed(package: str, install: str) -> Callable[[dict], str | None]:
    """A `host_check`: why not, when `package` cannot be imported here."""
    def check(options: dict) -> str | None:
        return None if importlib.util.find_spec(package) else f"{install} is not installed (`pip install {package}`)"
    return check


def _quantized_device(options: dict, device: str) -> str | None:
    if options["type"] != "float8dq":
        return None
    import torch

    if not device.startswith("cuda") or torch.cuda.get_device_capability(torch.device(device)) < (8, 9):
        return "float8 dynamic quantization (float8 matmuls) needs a CUDA GPU of compute capability 8.9 or newer"
    return None


def _quantized_apply(built: Any, options: dict) -> Undo:
    """The denoiser as `from_pretrained(..., quantization_config=TorchAoConfig(config), torch_dtype=dtype)` gives it,
    through diffusers' own torchao quantizer: nothing kept in float32 (the torchao quantizer does not keep
    `_keep_in_fp32_modules`), then every `nn.Linear` weight quantized (`create_quantized_param`, as the load does
    per weight). The undo puts back the weights and dtypes it had; while quantized, the original weights wait on the
    host, so the device holds what a quantized load leaves on it."""
    import torch
    import torchao.quantization as tq
    from diffusers import TorchAoConfig
    from diffusers.quantizers import DiffusersAutoQuantizer

    from lab.run.dtypes import checkpoint_dtype

    model = getattr(built.pipe, built.scenario.denoiser)
    device = torch.device(built.device)
    attrs, config_attrs = dict(vars(model)), dict(vars(model.config))
    recast: list[tuple[torch.Tensor, torch.Tensor]] = []
    for prefix, module in model.named_modules():
        tensors = [*module._parameters.items(),
                   *((n, b) for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set)]
        for name, tensor in tensors:
            full = f"{prefix}.{name}" if prefix else name
            if tensor is not None and tensor.dtype != built.dtype and torch.is_floating_point(tensor) \
                    and checkpoint_dtype(type(model), full, tensor, built.dtype) == torch.float32:
                recast.append((tensor, tensor.data))
                tensor.data = tensor.data.to(built.dtype)
    quantizer = DiffusersAutoQuantizer.from_config(TorchAoConfig(getattr(tq, QUANT_TYPES[options["type"]])()),
                                                   pre_quantized=False)
    quantizer.preprocess_model(model=model, device_map=None, keep_in_fp32_modules=[])
    originals: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    for name, param in list(model.named_parameters()):
        if quantizer.check_if_quantized_param(model, param, name, {}, param_device=device):
            owner, _, attr = name.rpartition(".")
            originals.append((model.get_submodule(owner), attr, param))
            quantizer.create_quantized_param(model, param.detach(), name, device, {}, [])
            param.data = param.data.to("cpu")
    quantizer.postprocess_model(model)
    model.hf_quantizer = quantizer

    def undo() -> None:
        for module, attr, param in originals:
            param.data = param.data.to(device)
            module._parameters[attr] = param
        for tensor, data in recast:
            tensor.data = data
        for saved, now in ((attrs, vars(model)), (config_attrs, vars(model.config))):
            for key in set(now) - set(saved):
                del now[key]
            now.update(saved)

    return undo


SETTINGS: dict[str, Kind] = {k.name: k for k in [
    Kind("first_block_cache", "skip the transformer's other blocks when the first block's residual changed little "
         "since the last step (a decision on the host per forward)", "transformer.enable_cache(FirstBlockCacheConfig)",
         options={"threshold": 0.05},
         ranges={"threshold": Range(0, None, "a call computes every block when its first block's residual changed by "
                                            "more than it: a mean absolute change, never below 0")},
         check=_cache_probe("FirstBlockCacheConfig", lambda pipe, o: {"threshold": o["threshold"]}, _blocks_registered),
         apply=_cache("FirstBlockCacheConfig", lambda built, o: {"threshold": o["threshold"]}),
         verify="the cache decides per forward from the data, and starts afresh in every call: two calls of one arm "
                "give the same output (tests/test_settings.py), so the arms are compared as without a setting; a fix "
                "that moves a residual across the threshold changes a decision and shows as outputs differ. Each "
                "arm's decisions in its verifying call are counted (calls computed, calls skipped) and shown",
         decides=_first_block_decisions),
    Kind("pyramid_attention_broadcast", "reuse attention outputs every N steps inside a timestep range (PAB)",
         "transformer.enable_cache(PyramidAttentionBroadcastConfig)",
         options={"skip_range": 2},
         ranges={"skip_range": Range(1, None, "the attention is computed every N-th call (`iteration % N`)")},
         check=_cache_probe("PyramidAttentionBroadcastConfig", lambda pipe, o: {
             "spatial_attention_block_skip_range": o["skip_range"],
             "current_timestep_callback": _current_timestep(pipe)}, _pab_check),
         apply=_cache("PyramidAttentionBroadcastConfig", lambda built, o: {
             "spatial_attention_block_skip_range": o["skip_range"],
             "current_timestep_callback": _current_timestep(built.pipe)})),
    Kind("taylorseer_cache", "predict block outputs from a Taylor series of earlier steps (TaylorSeer)",
         "transformer.enable_cache(TaylorSeerCacheConfig)",
         options={"interval": 5},
         ranges={"interval": Range(1, None, "a full computation every N steps (`% cache_interval`)")},
         check=_cache_probe("TaylorSeerCacheConfig", lambda pipe, o: {"cache_interval": o["interval"]}),
         apply=_cache("TaylorSeerCacheConfig", lambda built, o: {"cache_interval": o["interval"]})),
    Kind("mag_cache", "skip the transformer's blocks while the accumulated error that the checkpoint's magnitude "
         "ratios predict stays under a threshold (MagCache; decided on the host from the ratios, no device read)",
         "transformer.enable_cache(MagCacheConfig(mag_ratios=...))",
         options={"threshold": 0.06, "max_skip": 3, "retention": 0.2, "ratios": "measured"},
         ranges={"threshold": Range(0, None, "the accumulated error, never below 0, is held against it"),
                 "max_skip": Range(0, None, "the most steps skipped in a row"),
                 "retention": Range(0, 1, "the share of the first steps never skipped")},
         choices={"ratios": ("measured", "flux")}, check=_mag_cache_check,
         apply=_cache("MagCacheConfig", _mag_cache_kwargs),
         verify="the skips follow the ratios, fixed before the first timed call (measured by one calibration call "
                "of this pipeline, or FLUX.1's published ones), so two calls of one arm give the same output and the "
                "arms are compared as without a setting"),
    Kind("faster_cache", "reuse attention outputs every N steps, extrapolated from the last two, and (with CFG run "
         "as one batch) approximate the unconditional branch from the conditional one (FasterCache)",
         "transformer.enable_cache(FasterCacheConfig)",
         options={"skip_range": 2, "weight": 0.3, "uncond_skip_range": 5},
         ranges={"skip_range": Range(1, None, "the attention is computed every N-th iteration (`% N`)"),
                 "weight": Range(0, 1, "the weight of the extrapolated attention, which diffusers documents from 0 "
                                       "to 1"),
                 "uncond_skip_range": Range(1, None, "the unconditional branch is computed every N-th iteration "
                                                     "(`% N`)")},
         check=_cache_probe("FasterCacheConfig", lambda pipe, o: _faster_cache_options(pipe, o), _faster_cache_check),
         apply=_cache("FasterCacheConfig", _faster_cache_kwargs),
         verify="the skips follow the step count and the timestep, and the cache starts afresh in every call: two "
                "calls of one arm give the same output (tests/test_settings.py), so the arms are compared as without "
                "a setting"),
    Kind("model_cpu_offload", "each model on the accelerator only while it runs, else on the host",
         "pipe.enable_model_cpu_offload()", accelerator_only=_ON_CPU, apply=_offload("enable_model_cpu_offload")),
    Kind("sequential_cpu_offload", "every leaf module's weights copied to the accelerator for its own forward",
         "pipe.enable_sequential_cpu_offload()", accelerator_only=_ON_CPU,
         apply=_offload("enable_sequential_cpu_offload")),
    Kind("group_offload", "groups of blocks (or leaf modules) onloaded for their forward, optionally on a side stream",
         "pipe.enable_group_offload(...)",
         options={"level": "block_level", "blocks": 1, "stream": False, "record_stream": False},
         ranges={"blocks": Range(1, None, "the blocks in each group (`num_blocks_per_group`)")},
         choices={"level": ("block_level", "leaf_level")}, accelerator_only=_ON_CPU, check=_group_offload_check,
         apply=_group_offload),
    Kind("layerwise_casting", "transformer weights stored in float8, cast to the compute dtype layer by layer",
         "transformer.enable_layerwise_casting(storage_dtype, compute_dtype)",
         options={"storage": "float8_e4m3fn"}, choices={"storage": ("float8_e4m3fn", "float8_e5m2")},
         check=_storage_check, apply=_layerwise_casting),
    Kind("quantized", "the denoiser's linear weights quantized with torchao, as a `TorchAoConfig` load gives them "
         "(int8 or float8, weight-only or with dynamic activations)",
         "from_pretrained(..., quantization_config=TorchAoConfig(...)), per weight after the build",
         options={"type": "int8wo"}, choices={"type": tuple(QUANT_TYPES)},
         host_check=_installed("torchao", "torchao"), device_check=_quantized_device, apply=_quantized_apply,
         verify="both arms run the same quantized weights: outputs compared as without a setting"),
    Kind("attention_backend", "attention through another kernel (native SDPA, flash, cuDNN, flex, sage, ...)",
         "transformer.set_attention_backend(name)", options={"backend": "native"},
         check=_attention_check, apply=_attention_apply, positional="backend"),
    Kind("lora", "a random LoRA on the attention projections, loaded with the pipeline's `load_lora_weights` (PEFT)",
         "pipe.load_lora_weights(...); fused: pipe.fuse_lora()",
         options={"rank": 16, "scale": 1.0, "fused": False, "seed": 0}, check=_lora_check,
         ranges={"rank": Range(1, None, "the adapter's rank (`LoraConfig(r=...)`)"),
                 "seed": Range(0, 2**64 - 1, "`torch.manual_seed` takes it")},
         host_check=_installed("peft", "PEFT"), apply=_lora_apply),
]}

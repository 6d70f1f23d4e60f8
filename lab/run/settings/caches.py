"""The caches users turn on over a denoiser (`transformer.enable_cache(...Config)`): first-block cache, pyramid
attention broadcast, TaylorSeer, MagCache and FasterCache. Each is checked before the build by turning it on over the
transformer made on the meta device from its tiny config (a cache whose hooks match no module is refused, as
`enable_cache` itself says nothing), and refused where the pipeline's guidance or blocks are of a kind it cannot
serve."""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Iterator

from lab.base.errors import UsageError
from lab.run.settings.hooks import hook_count
from lab.run.settings.kind import Kind, Range, Target, Undo


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


KINDS = (
    Kind("first_block_cache", "skip the transformer's other blocks when the first block's residual changed little "
         "since the last step (a decision on the host per forward)", "transformer.enable_cache(FirstBlockCacheConfig)",
         options={"threshold": 0.05},
         ranges={"threshold": Range(0, None, "a call computes every block when its first block's residual changed by "
                                            "more than it: a mean absolute change, never below 0")},
         check=_cache_probe("FirstBlockCacheConfig", lambda pipe, o: {"threshold": o["threshold"]},
                            _blocks_registered),
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
)

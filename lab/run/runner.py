"""Running a built scenario: compile modes, one timed call, the light stage and per-step timing report."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from typing import Any

import torch
from torch.utils._pytree import tree_map

from lab.apply.patching import Patcher
from lab.base.errors import UsageError
from lab.run.instrument import Clock, Instrumentation, Marks
from lab.run.scenario import Built, output_latents

MODES = ("eager", "compile")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    """How the transformer is compiled (mirrors the upstream harness flags)."""

    mode: str = "eager"  # "eager" | "compile"
    regional: bool = True
    fullgraph: bool = False
    compile_mode: str = "default"
    backend: str = "inductor"  # "eager" runs dynamo alone (graph capture, guards, graph breaks): no C compiler needed

    def describe(self) -> str:
        if self.mode == "eager":
            return "eager"
        kind = "regional" if self.regional else "full"
        cloned = ", outputs cloned" if self.clones_outputs else ""
        backend = "" if self.backend == "inductor" else f", backend={self.backend}"
        return f"compile ({kind}, fullgraph={self.fullgraph}, mode={self.compile_mode}{cloned}{backend})"

    @property
    def clones_outputs(self) -> bool:
        """Whole-transformer CUDA graphs replay into the same output memory, and a pipeline with two guidance calls
        per step reads the first call's output after the second: torch's advice is to clone outside the graph."""
        return self.mode == "compile" and not self.regional and self.compile_mode == "reduce-overhead"


def apply_compile(built: Built, spec: CompileSpec) -> None:
    if spec.mode not in MODES:
        raise UsageError(f"Unknown mode `{spec.mode}`; choose one of {', '.join(MODES)}.")
    if spec.mode == "eager":
        return
    if spec.compile_mode not in COMPILE_MODES:
        raise UsageError(f"Unknown compile mode `{spec.compile_mode}`; choose one of {', '.join(COMPILE_MODES)}.")
    kwargs = {"fullgraph": spec.fullgraph}
    if spec.backend == "inductor":
        kwargs["mode"] = spec.compile_mode
    else:  # torch takes a mode for Inductor only
        kwargs["backend"] = spec.backend
    transformer = getattr(built.pipe, built.scenario.denoiser)
    if spec.regional and not regional_compile_possible(built):
        raise UsageError(f"`{type(transformer).__name__}` names no repeated blocks in diffusers (its "
                         "`_repeated_blocks` is empty), so it cannot be compiled regionally: use "
                         "`--no-compile-regional` to compile the whole model.")
    # every denoiser the loop calls: Wan 2.2's second expert (`transformer_2`) too
    for model in (transformer, getattr(built.pipe, "transformer_2", None)):
        if model is None:
            continue
        if spec.regional:
            model.compile_repeated_blocks(**kwargs)
            continue
        # The instance's forward, compiled in its place (not `nn.Module.compile`, which compiles `__call__` and so
        # would trace the lab's instrumentation around forward: its CUDA events never recorded, and a recompile per
        # call). What it compiles looks the class's forward up at each call, as a plain call does: a fix or a
        # change that rewrites the class's forward then runs in its arm (compiled once per arm, the guards telling
        # the two apart), where a bound method taken here would keep running the forward of the build.
        forward = torch.compile(_class_forward(model), **kwargs)
        model.forward = _cloning_outputs(forward) if spec.clones_outputs else forward


def regional_compile_possible(built: Built) -> bool:
    """Whether the denoiser names blocks for `compile_repeated_blocks` (SD3's transformer and the UNets do not)."""
    return bool(getattr(getattr(built.pipe, built.scenario.denoiser), "_repeated_blocks", None))


def _class_forward(model: torch.nn.Module) -> Any:
    """`model`'s forward as its class holds it at the time of each call."""
    cls = type(model)

    @functools.wraps(cls.forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return cls.forward(model, *args, **kwargs)

    return forward


def _cloning_outputs(forward: Any) -> Any:
    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, output)

    return wrapper


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclasses.dataclass
class CallResult:
    output: torch.Tensor
    wall_ms: float
    steps_ms: list[float]
    stages_ms: dict[str, float]


def timed_call(built: Built, *, seed: int = 0, marks: bool = True, labels: bool = False,
               extra_patch: Any = None) -> CallResult:
    """One call: host wall time between two syncs at the call boundaries, and step/stage marks.

    The marks are CUDA events (no sync of their own) on the GPU, host timestamps on the CPU. With `labels`, the
    call runs inside `pipeline_call` and every component and step carries its profiler label.
    """
    clock = Clock(built.device)
    recorded = Marks(clock) if marks else None
    with Patcher() as patcher:
        inst = Instrumentation(built.pipe, patcher, labels=labels, marks=recorded)
        if extra_patch is not None:
            extra_patch(inst)
        kwargs = built.kwargs(seed)
        kwargs["callback_on_step_end"] = inst.step_end_callback
        # As timeit does: no garbage-collector pauses inside the timed region (callers collect between blocks).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        synchronize(built.device)
        start = clock.mark() if recorded is not None else None
        t0 = time.perf_counter()
        try:
            with torch.profiler.record_function("pipeline_call") if labels else contextlib.nullcontext():
                out = built.pipe(**kwargs)
            end = clock.mark() if recorded is not None else None
            synchronize(built.device)
            wall_ms = (time.perf_counter() - t0) * 1e3
        finally:
            inst.close()
            if gc_was_enabled:
                gc.enable()
    latents = output_latents(out)
    report = recorded.read() if recorded is not None else {"steps_ms": [], "stages_ms": {}}
    if recorded is not None:
        report["stages_ms"]["pipeline_call"] = clock.elapsed_ms(start, end)
    return CallResult(latents, wall_ms, report["steps_ms"], report["stages_ms"])


def check_finite(latents: torch.Tensor) -> str | None:
    """A message when the output has NaN or inf values (random weights scaled wrongly), else None."""
    t = latents.float()
    bad = (~torch.isfinite(t)).sum().item()
    return f"{bad} of {t.numel()} output values are NaN or inf" if bad else None

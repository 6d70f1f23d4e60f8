"""Instrumenting a pipeline call without changing diffusers: profiler labels, step boundaries, stage timers.

Labels follow the upstream profiling harness (`transformer_forward`, `scheduler_step`, `vae_decode`, `vae_encode`,
`encode_prompt`, `pipeline_call`) plus one `denoise_step_<i>` span per denoising step. Everything is attached
through a :class:`~lab.apply.patching.Patcher`, so it is removed exactly afterwards.

Step boundaries: a step starts at the first transformer call after the previous step ended (or the first call of
all) and ends in `callback_on_step_end`, which every target pipeline calls after all of a step's scheduler steps.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import torch

from lab.apply.patching import Patcher
from lab.base.marks import LOOP_BEGIN, STEP_PREFIX

#: (component, method, label) as upstream's `annotate_pipeline` table.
LABELS = (
    ("transformer", "forward", "transformer_forward"),
    ("transformer_2", "forward", "transformer_forward"),  # Wan 2.2's low-noise expert, which takes the later steps
    ("unet", "forward", "transformer_forward"),  # the denoiser of a UNet pipeline (SDXL), labelled as upstream's
    ("vae", "decode", "vae_decode"),
    ("vae", "encode", "vae_encode"),
    ("scheduler", "step", "scheduler_step"),
    (None, "encode_prompt", "encode_prompt"),
)


class Clock:
    """Marks on the device timeline (CUDA events, no sync) or, on the CPU, host timestamps."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Read after the call has been synchronized."""
        if self.cuda:
            return start.elapsed_time(end)
        return (end - start) * 1e3


@dataclasses.dataclass
class Marks:
    """Step and stage marks of one call, read into milliseconds by :meth:`read` after the call completes."""

    clock: Clock
    steps: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)
    stages: dict[str, list[tuple[Any, Any]]] = dataclasses.field(default_factory=dict)

    def read(self) -> dict[str, Any]:
        ms = self.clock.elapsed_ms
        steps = [ms(a, b) for a, b in self.steps]
        stages = {k: sum(ms(a, b) for a, b in v) for k, v in self.stages.items()}
        if self.steps:
            stages["denoise_loop"] = ms(self.steps[0][0], self.steps[-1][1])
        return {"steps_ms": steps, "stages_ms": stages}


class Instrumentation:
    """Attach labels (for the profiler) and/or marks (for timing) to a built pipeline through `patcher`.

    `labels=True` wraps components in `record_function` ranges and names each step `denoise_step_<i>`; `marks`
    records step and stage boundaries. `on_step_begin(i)` / `on_step_end(i)` hooks let a caller act at step
    boundaries (step-selective profiling, the calibration's injected stall).
    """

    def __init__(self, pipe: Any, patcher: Patcher, *, labels: bool, marks: Marks | None = None) -> None:
        self.pipe = pipe
        self.labels = labels
        self.marks = marks
        self._step = 0
        self._step_range = None
        self._step_start = None
        self._in_forward = 0
        self.on_step_begin = None  # optional hook(i) for step-selective profiling
        self.on_step_end = None
        for component, method, label in LABELS:
            owner = pipe if component is None else getattr(pipe, component, None)
            if owner is None or not hasattr(owner, method):
                continue
            patcher.setattr(owner, method, self._wrap(owner, method, label))
        if labels and hasattr(pipe, "progress_bar"):
            patcher.setattr(pipe, "progress_bar", self._mark_loop(pipe.progress_bar))

    @staticmethod
    def _mark_loop(progress_bar):
        """`pipe.progress_bar`, opened right before the denoising loop, leaving a zero-length `LOOP_BEGIN` range."""

        @functools.wraps(progress_bar)
        def wrapper(*args, **kwargs):
            with torch.profiler.record_function(LOOP_BEGIN):
                pass
            return progress_bar(*args, **kwargs)

        return wrapper

    def _wrap(self, owner: Any, method: str, label: str):
        # Wrap the class's function and bind it to the instance (rather than closing over the bound method), so
        # `copy.deepcopy(pipe.scheduler)` (LTX2's audio scheduler) gets a method bound to the copy.
        # An instance's own attribute wins, as it does for a plain call: a compiled forward (whole-transformer
        # compile), or the forward that diffusers' hook registry installs.
        own = vars(owner).get(method)
        func = getattr(type(owner), method) if own is None else (lambda this, *args, **kwargs: own(*args, **kwargs))
        instrument = self

        @functools.wraps(func)
        def wrapper(this, *args, **kwargs):
            if label == "transformer_forward" and instrument._in_forward == 0:
                instrument._maybe_begin_step()
            stage = None
            if instrument.marks is not None and label in ("vae_decode", "vae_encode", "encode_prompt"):
                stage = instrument.marks.clock.mark()
            instrument._in_forward += label == "transformer_forward"
            try:
                if instrument.labels:
                    with torch.profiler.record_function(label):
                        return func(this, *args, **kwargs)
                return func(this, *args, **kwargs)
            finally:
                instrument._in_forward -= label == "transformer_forward"
                if stage is not None:
                    instrument.marks.stages.setdefault(label, []).append((stage, instrument.marks.clock.mark()))

        return wrapper.__get__(owner)

    def _maybe_begin_step(self) -> None:
        if self._step_start is not None:
            return
        if self.on_step_begin is not None:
            self.on_step_begin(self._step)
        self._step_start = self.marks.clock.mark() if self.marks is not None else True
        if self.labels:
            self._step_range = torch.profiler.record_function(f"{STEP_PREFIX}{self._step}")
            self._step_range.__enter__()

    def step_end_callback(self, pipe, i, t, callback_kwargs):
        """Pass as `callback_on_step_end`: closes step `i`."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        if self.marks is not None and self._step_start is not None:
            self.marks.steps.append((self._step_start, self.marks.clock.mark()))
        self._step_start = None
        if self.on_step_end is not None:
            self.on_step_end(self._step)
        self._step += 1
        return {}

    def close(self) -> None:
        """Close a step range left open (a call that raised)."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None


class InjectedStall:
    """A per-step host stall of known cost: a device sync plus `cost_ms` of host sleep at every step end, as an
    arm's `hook`. `ran` counts the stalls that ran: the positive control of `lab calibrate` (an arm with it against
    one without must be told apart) is checked by that count, not by the clock."""

    def __init__(self, device: str, cost_ms: float) -> None:
        self.device, self.cost_ms, self.ran = device, cost_ms, 0

    def __call__(self, inst: Instrumentation) -> None:
        previous = inst.on_step_end

        def stall(i: int) -> None:
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            time.sleep(self.cost_ms / 1e3)
            self.ran += 1
            if previous is not None:
                previous(i)

        inst.on_step_end = stall


def injected_stall(device: str, cost_ms: float) -> InjectedStall:
    return InjectedStall(device, cost_ms)

"""Model CPU offload (`pipe.enable_model_cpu_offload()`): each model on the accelerator only while it runs, else on
the host; and what every offloading setting shares: nothing to offload on a CPU, and an undo that removes the
pipeline's hooks and moves it back."""

from __future__ import annotations

from typing import Any, Callable

from lab.run.settings.kind import Kind, Undo

ON_CPU = "on the CPU the weights already live where they run: there is nothing to offload"


def offloaded(method: str) -> Callable:
    def apply_offload(built: Any, options: dict) -> Undo:
        getattr(built.pipe, method)(device=built.device)

        def undo() -> None:
            built.pipe.remove_all_hooks()
            built.pipe.to(built.device)

        return undo

    return apply_offload


KINDS = (
    Kind("model_cpu_offload", "each model on the accelerator only while it runs, else on the host",
         "pipe.enable_model_cpuoffloaded()", accelerator_only=ON_CPU, apply=offloaded("enable_model_cpu_offload")),
)

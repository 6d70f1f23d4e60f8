"""Sequential CPU offload (`pipe.enable_sequential_cpu_offload()`): every leaf module's weights copied to the
accelerator for its own forward."""

from __future__ import annotations

from lab.run.settings.kind import Kind
from lab.run.settings.model_offload import ON_CPU, offloaded

KINDS = (
    Kind("sequential_cpu_offload", "every leaf module's weights copied to the accelerator for its own forward",
         "pipe.enable_sequential_cpuoffloaded()", accelerator_only=ON_CPU,
         apply=offloaded("enable_sequential_cpu_offload")),
)

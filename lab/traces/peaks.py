"""The peak rates of each GPU model, from the vendor's datasheet: the roofline's ceilings.

One row per model: dense tensor-core rates (the datasheets print bf16/fp16 and tf32 "with sparsity", twice the dense
rate; a diffusion model runs dense), the plain fp32 rate, the memory bandwidth, and where the numbers come from. A
trace names its GPU in `deviceProperties`; :func:`peak_for` finds the row by that name. A GPU that is not in the table
gets no roofline rather than a guessed one.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Peak:
    model: str
    pattern: str  # matched against the trace's device name, case-insensitive
    bf16_tflops: float  # dense bf16/fp16 tensor-core rate (fp32 accumulate)
    tf32_tflops: float  # dense tf32 tensor-core rate
    fp32_tflops: float  # plain fp32 (no tensor cores): what a float32 matmul runs at unless TF32 is allowed
    bandwidth_tbs: float  # device memory, TB/s
    source: str

    def tflops(self, dtype: str) -> float:
        """The ceiling for operands of `dtype` (`bf16`, `fp16`, `fp32`, `tf32`)."""
        return {"bf16": self.bf16_tflops, "fp16": self.bf16_tflops, "tf32": self.tf32_tflops}.get(dtype, self.fp32_tflops)


_NV = "https://www.nvidia.com/en-us/data-center/"
PEAKS: tuple[Peak, ...] = (
    Peak("H200 NVL", r"h200 nvl", 835.5, 417.5, 60.0, 4.8, _NV + "h200/"),
    Peak("H200 SXM", r"h200", 989.5, 494.7, 67.0, 4.8, _NV + "h200/"),
    Peak("H100 NVL", r"h100 nvl", 835.5, 417.5, 60.0, 3.9, _NV + "h100/"),
    Peak("H100 PCIe", r"h100 pcie", 756.5, 378.0, 51.0, 2.0, _NV + "h100/"),
    Peak("H100 SXM", r"h100", 989.5, 494.7, 67.0, 3.35, _NV + "h100/"),
    Peak("A100 SXM 80GB", r"a100.*80gb", 312.0, 156.0, 19.5, 2.039, _NV + "a100/"),
    Peak("A100 40GB", r"a100", 312.0, 156.0, 19.5, 1.555, _NV + "a100/"),
    Peak("L40S", r"l40s", 362.05, 183.0, 91.6, 0.864, _NV + "l40s/"),
    Peak("L4", r"\bl4\b", 121.0, 60.0, 30.3, 0.3, _NV + "l4/"),
    Peak("RTX 4090", r"rtx 4090", 165.2, 82.6, 82.6, 1.008,
         "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
)


def peak_for(device_name: str | None) -> Peak | None:
    """The row of the GPU a trace names (`NVIDIA H200`, `NVIDIA H100 80GB HBM3`), or None."""
    if not device_name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, device_name, re.IGNORECASE):
            return peak
    return None

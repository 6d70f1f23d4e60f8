"""Each piece of a call's device work put in one class (:data:`CLASSES`) from its own name and the operators that
launched it (the innermost `cpu_op` whose `External id` the kernel carries, and the operators enclosing that one):
GEMMs, attention with the backend that ran it, convolutions, normalisations, elementwise work, layout copies
(`copy_`, `contiguous`, `clone`, `cat`, transposes: bytes moved to lay a tensor out again, no arithmetic),
reductions, copies to and from the host, sets, and the rest. Pure: names in, a class out."""

from __future__ import annotations

import re

CLASSES = ("gemm", "attention", "conv", "norm", "elementwise", "layout copy", "reduction", "host copy", "memset",
           "other")


#: the classes whose waste the lab hunts: bytes moved to lay tensors out again
LAYOUT = "layout copy"


_SDPA_BACKEND = (  # operator name fragment -> the backend that ran (the first match wins)
    ("_cudnn_attention", "cudnn"), ("flash_attention_for_cpu", "flash (cpu)"), ("_flash_attention", "flash"),
    ("_efficient_attention", "efficient"), ("_scaled_dot_product_attention_math", "math"),
    ("fused_attention_overrideable", "overrideable"), ("flex_attention", "flex"),
)


_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::addbmm",
             "aten::_addmm_activation", "aten::matmul", "aten::linear", "aten::_int_mm"}


_CONV_OPS = re.compile(r"^aten::(?:_?convolution|conv\d?d|conv_transpose\dd|cudnn_convolution.*|mkldnn_convolution"
                       r"|slow_conv.*|_conv_depthwise2d|miopen_convolution.*)$")


_NORM_OPS = re.compile(r"^aten::(?:native_)?(?:layer_norm|group_norm|batch_norm|instance_norm|rms_norm)$"
                       r"|^aten::_fused_rms_norm$|^aten::native_batch_norm$")


_LAYOUT_OPS = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack", "aten::repeat",
               "aten::repeat_interleave", "aten::constant_pad_nd", "aten::index_select", "aten::flip", "aten::roll",
               "aten::_unsafe_view", "aten::reshape", "aten::flatten", "aten::unfold", "aten::pixel_shuffle",
               "aten::pixel_unshuffle", "aten::narrow_copy", "aten::_reshape_copy", "aten::permute_copy"}


_REDUCTION_OPS = re.compile(r"^aten::(?:sum|mean|amax|amin|max|min|softmax|_softmax|log_softmax|_log_softmax|var|std"
                            r"|var_mean|norm|linalg_vector_norm|argmax|argmin|cumsum|all|any|prod|logsumexp|topk"
                            r"|sort|nonzero)$")


_COPY_KERNEL = re.compile(r"copy_kernel|CatArrayBatchedCopy|transpose|nchwToNhwc|nhwcToNchw|Transpose", re.I)


_TRITON = re.compile(r"^triton_(poi|red|per|tem)_fused_?(.*?)(?:_\d+)?$")


_TRITON_LAYOUT = {"clone", "cat", "permute", "transpose", "view", "copy", "slice", "unbind", "split", "expand",
                  "stack", "unsqueeze", "squeeze", "select", "reshape", "unsafe", "alias", "constant", "pad", "nd",
                  "as", "strided", "repeat", "interleave", "narrow", "flatten", "t", "contiguous", "index"}


_NORM_WORDS = re.compile(r"layer_norm|rms_norm|group_norm|batch_norm|instance_norm|layernorm|rmsnorm|groupnorm", re.I)


def attention_backend(chain: list[str], kernel: str | None = None) -> str | None:
    """The attention backend an operator chain (innermost first) or a kernel name shows, or None."""
    for op in chain:
        for fragment, backend in _SDPA_BACKEND:
            if fragment in op:
                return backend
    if kernel is None or kernel.startswith("triton_"):
        return None
    k = kernel.lower()
    if "sdpa" in k and "cudnn" in k:
        return "cudnn"
    if "fmha" in k or "efficient_attention" in k or "mem_eff" in k:
        return "efficient"
    if "flash" in k and ("fwd" in k or "flash::" in k or "flash_" in k):
        return "flash"
    return None


def _triton_class(name: str) -> tuple[str, str | None] | None:
    m = _TRITON.match(name)
    if m is None:
        return None
    kind, ops = m.group(1), m.group(2)
    if kind == "tem":  # a template: a matmul, a convolution or flex attention, written by inductor
        if "flex_attention" in ops:
            return "attention", "flex"
        if "convolution" in ops:
            return "conv", None
        return ("gemm", None) if re.search(r"(?:^|_)(?:mm|addmm|bmm|baddbmm)(?:_|$)", ops) else ("other", None)
    if _NORM_WORDS.search(ops):
        return "norm", None
    if kind in ("red", "per"):
        return "reduction", None
    words = {w for w in ops.split("_") if w}
    return ("layout copy" if words and words <= _TRITON_LAYOUT else "elementwise"), None


def classify(kernel: str | None, chain: list[str]) -> tuple[str, str | None]:
    """The class of one piece of device work and, for attention, its backend. `kernel`: the GPU kernel's name (None
    on a CPU-only trace: the operator itself did the work); `chain`: the launching operators, innermost first."""
    if kernel is not None:
        triton = _triton_class(kernel)
        if triton is not None:
            return triton
    backend = attention_backend(chain, kernel)
    if backend is not None:
        return "attention", backend
    inner = chain[0] if chain else ""
    if any(_CONV_OPS.match(op) for op in chain):
        return ("layout copy", None) if kernel and _COPY_KERNEL.search(kernel) else ("conv", None)
    copying = inner in _LAYOUT_OPS or (kernel is not None and _COPY_KERNEL.search(kernel) is not None)
    if copying:
        # a copy that changes dtype or device (`.to`, `.float()`) is arithmetic on every element, not a layout
        return ("elementwise", None) if "aten::_to_copy" in chain else ("layout copy", None)
    k = (kernel or "").lower()
    if any(op in _GEMM_OPS for op in chain[:3]) or re.search(r"gemm|nvjet|cutlass|xmma|cublas|splitk", k):
        return "gemm", None
    if any(_NORM_OPS.match(op) for op in chain[:3]) or _NORM_WORDS.search(k):
        return "norm", None
    if _REDUCTION_OPS.match(inner) or re.search(r"reduce|softmax|cub::|scan_|sort|topk", k):
        return "reduction", None
    if "elementwise" in k or "fill" in k or (kernel is None and inner.startswith("aten::")):
        return "elementwise", None
    return "other", None


def strided_elementwise(kernel: str) -> bool:
    """An eager kernel of PyTorch's general, strided elementwise kind (an add, a copy, a cast): PyTorch picks it when
    an operand is not contiguous (contiguous operands get the vectorized or unrolled kernels)."""
    return kernel.startswith("void at::native::elementwise_kernel<")

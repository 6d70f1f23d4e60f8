"""The arithmetic of a call from its operators' shapes (`record_shapes`): the FLOPs of every matmul, convolution and
attention (counted once, at the outermost such operator), the bytes each class of work must at least move (its
operators' tensor arguments and result, each once), and the roofline: for the GPU the trace names
(:mod:`lab.traces.peaks`), each class's achieved FLOP/s and bytes/s against the ceilings, the time it would take at
them (the larger of FLOPs over the peak rate and bytes over the bandwidth), and the step's model FLOP utilisation."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np

from lab.traces.operators import Ops
from lab.traces.peaks import peak_for
from lab.traces.trace import Trace

ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "bool": 1,
                  "unsigned char": 1, "signed char": 1, "short int": 2, "c10::Float8_e4m3fn": 1,
                  "c10::Float8_e5m2": 1, "c10::complex<float>": 8, "c10::complex<double>": 16}


_DTYPE = {"float": "fp32", "double": "fp64", "c10::BFloat16": "bf16", "c10::Half": "fp16"}


_SDPA_FLOPS = re.compile(r"^aten::(?:_scaled_dot_product_(?:flash|efficient|cudnn)_attention|"
                         r"_scaled_dot_product_flash_attention_for_cpu|_flash_attention_forward|"
                         r"_efficient_attention_forward|_cudnn_attention_forward|_scaled_dot_product_fused_attention_overrideable)$")


_MATMUL_FLOPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::addbmm",
                 "aten::_addmm_activation", "aten::_int_mm"}


def _is_flop_op(name: str) -> bool:
    return name in _MATMUL_FLOPS or name == "aten::convolution" or bool(_SDPA_FLOPS.match(name))


def _numel(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def _tensors(dims, types) -> list[tuple[list[int], str]]:
    """The tensor arguments of an operator: (sizes, type) for each argument with a tensor type."""
    out = []
    for d, t in zip(dims or (), types or ()):
        if isinstance(d, list) and t in ELEMENT_BYTES and (d or t):
            if d and isinstance(d[0], list):  # a list of tensors (cat, stack)
                out.extend((list(x), t) for x in d if isinstance(x, list))
            else:
                out.append((list(d), t))
    return out


def _ints_of(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text or "")]


def op_flops(name: str, dims: list, concrete: list | None) -> float:
    """FLOPs of one matmul, convolution or attention operator from its arguments' sizes (a multiply-add is two)."""
    try:
        if name in ("aten::mm", "aten::_scaled_mm", "aten::_int_mm"):
            (m, k), (_, n) = dims[0][-2:], dims[1][-2:]
            return 2.0 * m * k * n
        if name in ("aten::addmm", "aten::_addmm_activation"):
            (m, k), (_, n) = dims[1][-2:], dims[2][-2:]
            return 2.0 * m * k * n
        if name == "aten::bmm":
            b, m, k = dims[0]
            return 2.0 * b * m * k * dims[1][2]
        if name in ("aten::baddbmm", "aten::addbmm"):
            b, m, k = dims[1]
            return 2.0 * b * m * k * dims[2][2]
        if name == "aten::convolution":
            x, w = dims[0], dims[1]
            c = concrete or []
            if len(c) > 6 and c[6] == "True":  # transposed: every input element meets the whole kernel
                return 2.0 * x[0] * _numel(x[2:]) * _numel(w)
            stride, padding, dilation = (_ints_of(c[k]) if len(c) > k else [] for k in (3, 4, 5))
            out = 1
            for a, size in enumerate(x[2:]):
                s, p = (stride[a] if a < len(stride) else 1), (padding[a] if a < len(padding) else 0)
                d = dilation[a] if a < len(dilation) else 1
                out *= (size + 2 * p - d * (w[2 + a] - 1) - 1) // s + 1
            # each output element of each output channel is a dot product over (input channels / groups) x kernel
            return 2.0 * x[0] * w[0] * out * _numel(w[1:])
        if _SDPA_FLOPS.match(name):
            q, k, v = dims[0], dims[1], dims[2]
            batch_heads = _numel(q[:-2])
            return 2.0 * batch_heads * q[-2] * k[-2] * q[-1] + 2.0 * batch_heads * q[-2] * k[-2] * v[-1]
    except (IndexError, TypeError, ValueError):
        return 0.0
    return 0.0


def op_bytes(name: str, dims: list, types: list) -> int:
    """The bytes an operator must at least move: each tensor argument read once, and its result written once (the
    size of its largest argument, or the matmul's product; nothing more where the result is one of the arguments:
    in-place and `out=` forms, `copy_`)."""
    tensors = _tensors(dims, types)
    if not tensors:
        return 0
    read = sum(_numel(d) * ELEMENT_BYTES[t] for d, t in tensors)
    if name.endswith("_") or name == "aten::copy_":
        return read
    size = ELEMENT_BYTES[tensors[0][1]]
    if name in _MATMUL_FLOPS:  # the product: the first matrix's rows by the second's columns
        a, b = tensors[-2][0] if name in ("aten::addmm", "aten::baddbmm") else tensors[0][0], tensors[-1][0]
        if len(a) >= 2 and len(b) >= 2:
            return read + _numel(a[:-1]) * b[-1] * size
    if _SDPA_FLOPS.match(name) and len(tensors) >= 3:
        q, v = tensors[0][0], tensors[2][0]
        return read + _numel(q[:-1]) * v[-1] * size
    return read + max(_numel(d) * ELEMENT_BYTES[t] for d, t in tensors)


def _dtype(types: list | None) -> str | None:
    for t in types or ():
        if t in _DTYPE:
            return _DTYPE[t]
    return None


def flops(ops: Ops, klass: list[str], op_of: list[int], step_idx: np.ndarray, n_steps: int | None) -> dict:
    """FLOPs by class (and their main dtype) and the bytes each class must at least move, over the trace and, with
    steps, per step. `klass` and `op_of`: each piece of work's class and launching operator."""
    names = ops.ops.names
    dims_col, types_col = ops.ops.extra["dims"], ops.ops.extra["types"]
    concrete_col = ops.ops.extra.get("concrete")
    flops_by = defaultdict(float)
    flops_step = defaultdict(float)
    dtypes: Counter = Counter()
    for i, name in enumerate(names):
        if not _is_flop_op(name) or dims_col[i] is None:
            continue
        if any(_is_flop_op(names[a]) for a in ops.ancestors(i)):
            continue
        f = op_flops(name, dims_col[i], concrete_col[i] if concrete_col is not None else None)
        if f <= 0:
            continue
        c = "attention" if _SDPA_FLOPS.match(name) else "conv" if name == "aten::convolution" else "gemm"
        flops_by[c] += f
        dtypes[_dtype(types_col[i]) or "fp32"] += f
        if step_idx[i] >= 0:
            flops_step[c] += f
    bytes_by, bytes_step = _bytes(ops, klass, op_of, step_idx)
    main_dtype = dtypes.most_common(1)[0][0] if dtypes else None
    out = {"total": float(sum(flops_by.values())), "by_class": dict(flops_by), "dtype": main_dtype,
           "bytes_by_class": dict(bytes_by)}
    if n_steps:
        out["per_step"] = float(sum(flops_step.values())) / n_steps
        out["per_step_by_class"] = {c: v / n_steps for c, v in flops_step.items()}
        out["bytes_per_step_by_class"] = {c: v / n_steps for c, v in bytes_step.items()}
    return out


def _bytes(ops: Ops, klass: list[str], op_of: list[int], step_idx: np.ndarray) -> tuple[dict, dict]:
    """Bytes per class over the trace and in the steps: each launching operator's arguments once, in the class of its
    first piece of work."""
    names, dims_col, types_col = ops.ops.names, ops.ops.extra["dims"], ops.ops.extra["types"]
    bytes_by = defaultdict(float)
    bytes_step = defaultdict(float)
    seen: set[int] = set()
    for c, i in zip(klass, op_of):
        if i < 0 or i in seen or dims_col[i] is None:
            continue
        seen.add(i)
        b = op_bytes(names[i], dims_col[i], types_col[i])
        bytes_by[c] += b
        if step_idx[i] >= 0:
            bytes_step[c] += b
    return bytes_by, bytes_step


def roofline(trace: Trace, flops: dict, found: dict, n_steps: int | None) -> dict:
    """Each class's achieved rates against the ceilings of the GPU the trace names, per step (or over the trace
    without steps), from `flops` (`flops`) and the work by class `found` (`lab.traces.work.work_analysis`)."""
    device = trace.device_properties[0].get("name") if trace.device_properties else None
    peak = peak_for(device) if found["device"] == "gpu" else None
    if peak is None:
        return {"missing": f"no peak rates for {device!r} in lab/traces/peaks.py" if found["device"] == "gpu"
                else "a CPU-only trace: the roofline is the GPU's"}
    main_dtype = flops["dtype"]
    rate = peak.tflops(main_dtype or "bf16") * 1e12
    bandwidth = peak.bandwidth_tbs * 1e12
    per_step = found.get("per_step") or {}
    rows = {}
    scale = n_steps if n_steps else 1
    for c, entry in (per_step.items() if n_steps else found["by_class"].items()):
        if c in ("host copy", "memset", "other"):  # not bound by the device's ceilings (host copies: the link's)
            continue
        t = entry["us"] * 1e-6
        f = (flops.get("per_step_by_class") if n_steps else flops["by_class"]).get(c, 0.0)
        b = (flops.get("bytes_per_step_by_class") if n_steps else flops["bytes_by_class"]).get(c, 0.0)
        floor = max(f / rate, b / bandwidth)
        rows[c] = {"us": entry["us"], "tflops": f / t / 1e12 if t else None, "gbs": b / t / 1e9 if t else None,
                   "floor_us": floor * 1e6, "over_floor": (t / floor) if floor else None}
    step_s = (found.get("step_us") or 0.0) * 1e-6
    step_flops = flops.get("per_step") if n_steps else flops["total"]
    span_s = step_s if n_steps else found["total_us"] * 1e-6
    return {
        "gpu": peak.model, "dtype": main_dtype, "peak_tflops": rate / 1e12, "peak_tbs": peak.bandwidth_tbs,
        "source": peak.source, "per": "step" if n_steps else "trace", "by_class": rows,
        "floor_us": sum(r["floor_us"] for r in rows.values()),
        "mfu_pct": 100.0 * step_flops / (span_s * rate) if span_s and step_flops else None,
        "scale": scale,
    }

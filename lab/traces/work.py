"""Where the device time goes: the work of a call by kind, its sources, its arithmetic, and the roofline.

Every GPU kernel, copy and set is put in one class (:data:`CLASSES`) from its own name and the operators that
launched it (the innermost `cpu_op` whose `External id` the kernel carries, and the operators enclosing that one):
GEMMs, attention with the backend that ran it, convolutions, normalisations, elementwise work, layout copies
(`copy_`, `contiguous`, `clone`, `cat`, transposes: bytes moved to lay a tensor out again, no arithmetic),
reductions, copies to and from the host, sets, and the rest. A CPU-only trace has no kernels: its operators' own
time (their time less their children's) is classed the same way, so that a tiny run on a laptop answers in the
same terms.

Where the trace recorded shapes (`record_shapes`, which `lab profile` and the A/B's profiles turn on), the
operators' arguments give three more things:

- the arithmetic: the FLOPs of every matmul, convolution and attention (counted once, at the outermost such
  operator), and the bytes each class must at least move (its operators' tensor arguments and result, each once);
- the roofline: for the GPU the trace names, from :mod:`lab.traces.peaks`, each class's achieved FLOP/s and bytes/s
  against the ceilings, the time the class would take at them (the larger of FLOPs over the peak rate and bytes
  over the bandwidth), and the step's model FLOP utilisation: its FLOPs over the step's wall time at the peak rate;
- strided inputs: a matmul, linear, normalisation or attention fed a layout that costs a copy (`needs_copy`), with
  the Python line that called it. Such an input costs a layout copy inside the operator or a slower kernel in
  every call that sees it; the usual cause is an activation left transposed by a patch embedding
  (`flatten(2).transpose(1, 2)`) before a loop of blocks.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np

from lab.traces.peaks import peak_for
from lab.traces.timeline import DRIVER_LAUNCHES, RUNTIME_LAUNCHES, Frames, step_of, steps, us
from lab.traces.trace import Trace

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


# --- the operator tree -----------------------------------------------------------------------------------------------


class Ops:
    """The trace's CPU operators as a forest: for each operator its parent (the innermost operator enclosing it on
    its thread), and the index by `External id` that kernels carry."""

    def __init__(self, trace: Trace) -> None:
        ops = trace.cat("cpu_op")
        self.ops = ops
        n = len(ops)
        self.parent = np.full(n, -1, dtype=np.int64)
        order = np.lexsort((-ops.dur, ops.ts, ops.tid))
        stack: list[int] = []
        last_tid = None
        ts, end, tid = ops.ts.tolist(), ops.end.tolist(), ops.tid.tolist()
        parent = self.parent
        for i in order.tolist():
            if tid[i] != last_tid:
                stack, last_tid = [], tid[i]
            while stack and end[stack[-1]] <= ts[i]:
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
        external = ops.extra.get("external", np.full(n, -1))
        self.by_external = {e: i for i, e in enumerate(external.tolist()) if e >= 0}
        self._chains: dict[int, list[str]] = {}

    def chain(self, i: int, depth: int = 8) -> list[str]:
        """Operator names from `i` outwards."""
        found = self._chains.get(i)
        if found is None:
            found, j = [], i
            while j >= 0 and len(found) < depth:
                found.append(self.ops.names[j])
                j = int(self.parent[j])
            self._chains[i] = found
        return found

    def ancestors(self, i: int) -> list[int]:
        out, j = [], int(self.parent[i])
        while j >= 0:
            out.append(j)
            j = int(self.parent[j])
        return out

    def self_time(self) -> np.ndarray:
        """Each operator's time less its children's (ns)."""
        own = self.ops.dur.astype(np.int64).copy()
        has = self.parent >= 0
        np.subtract.at(own, self.parent[has], self.ops.dur[has])
        return np.maximum(own, 0)


# --- the arithmetic from shapes --------------------------------------------------------------------------------------

_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "bool": 1,
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
        if isinstance(d, list) and t in _ELEMENT_BYTES and (d or t):
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
    read = sum(_numel(d) * _ELEMENT_BYTES[t] for d, t in tensors)
    if name.endswith("_") or name == "aten::copy_":
        return read
    size = _ELEMENT_BYTES[tensors[0][1]]
    if name in _MATMUL_FLOPS:  # the product: the first matrix's rows by the second's columns
        a, b = tensors[-2][0] if name in ("aten::addmm", "aten::baddbmm") else tensors[0][0], tensors[-1][0]
        if len(a) >= 2 and len(b) >= 2:
            return read + _numel(a[:-1]) * b[-1] * size
    if _SDPA_FLOPS.match(name) and len(tensors) >= 3:
        q, v = tensors[0][0], tensors[2][0]
        return read + _numel(q[:-1]) * v[-1] * size
    return read + max(_numel(d) * _ELEMENT_BYTES[t] for d, t in tensors)


def _dtype(types: list | None) -> str | None:
    for t in types or ():
        if t in _DTYPE:
            return _DTYPE[t]
    return None


def _contiguous(sizes: list[int], strides: list[int]) -> bool:
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _as_rows(sizes: list[int], strides: list[int]) -> bool:
    """Whether a matmul operand can be read as a matrix without a copy: its leading dimensions merge into one (a
    view as (-1, last)) and one of the matrix's two strides is 1 (a transposed matrix is read as it is)."""
    kept = [(n, st) for n, st in zip(sizes[:-1], strides[:-1]) if n != 1]
    for (_, outer), (inner_n, inner) in zip(kept, kept[1:]):
        if outer != inner * inner_n:
            return False
    row = kept[-1][1] if kept else 0
    return strides[-1] == 1 or sizes[-1] == 1 or row == 1


#: operators whose tensor inputs are looked at for layouts that cost a copy, and the rule for each: a matmul's
#: operands must read as matrices (`_as_rows`; a linear's weight is laid out by the model), a normalisation's input
#: must be contiguous, an attention's inputs need a contiguous last dimension (their other strides are read as
#: they are). The outermost such operator is looked at: its children see what it made of the input.
_STRIDE_RULES = (
    (re.compile(r"^aten::linear$"), lambda arg, d, s: arg == 0 and not _as_rows(d, s)),
    (re.compile(r"^aten::(?:matmul|mm|addmm|bmm|baddbmm)$"), lambda arg, d, s: not _as_rows(d, s)),
    (re.compile(r"^aten::(?:layer_norm|group_norm|rms_norm)$"), lambda arg, d, s: arg == 0 and not _contiguous(d, s)),
    (re.compile(r"^aten::(?:scaled_dot_product_attention|_scaled_dot_product_\w+_attention\w*)$"),
     lambda arg, d, s: arg < 3 and s[-1] != 1 and d[-1] != 1),
)
_STRIDE_OPS = re.compile("|".join(p.pattern for p, _ in _STRIDE_RULES))


def needs_copy(op: str, arg: int, sizes: list[int], strides: list[int]) -> bool:
    """Whether argument `arg` of operator `op`, of these sizes and strides, costs a copy (or a strided kernel)."""
    return any(p.match(op) and rule(arg, sizes, strides) for p, rule in _STRIDE_RULES)


# --- the analyzer ----------------------------------------------------------------------------------------------------


def _launch_times(trace: Trace) -> dict[int, int]:
    rt = trace.cat("cuda_runtime").named(*RUNTIME_LAUNCHES)
    dr = trace.cat("cuda_driver").named(*DRIVER_LAUNCHES)
    return dict(zip(np.concatenate([rt.correlation, dr.correlation]).tolist(),
                    np.concatenate([rt.ts, dr.ts]).tolist()))


def _site(frames: Frames | None, ops: Ops, i: int, cache: dict[int, str]) -> str:
    """The user-code line that called operator `i` (looked up at the outermost operator's start)."""
    root = i
    j = int(ops.parent[i])
    while j >= 0:
        root, j = j, int(ops.parent[j])
    found = cache.get(root)
    if found is None:
        found = (frames.user_frame(int(ops.ops.ts[root])) if frames else None) or "(no Python stack)"
        cache[root] = found
    return found


def work_analysis(trace: Trace, frames: Frames | None = None, top: int = 5) -> dict:
    """Device work by class over the whole trace and per denoising step, attention backends, where each class comes
    from, and, with shapes, the arithmetic, the roofline and the strided inputs (the module's docstring)."""
    frames = frames if frames is not None else Frames(trace)
    ops = Ops(trace)
    spans = steps(trace)
    on_gpu = trace.has_gpu
    # one row per piece of work: class, backend, duration (ns), the time that places it in a step, the operator
    klass: list[str] = []
    backend: list[str | None] = []
    dur: list[int] = []
    when: list[int] = []
    began: list[int] = []  # when the work itself started (on the GPU: later than its launch)
    op_of: list[int] = []
    strided = [0, 0]
    classes: dict[tuple, tuple[str, str | None]] = {}  # (kernel, chain) -> its class: most kernels repeat
    if on_gpu:
        launched = _launch_times(trace)
        for cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            events = trace.cat(cat)
            external = events.extra.get("external", np.full(len(events), -1)).tolist()
            for name, d, corr, ext, start in zip(events.names, events.dur.tolist(), events.correlation.tolist(),
                                                  external, events.ts.tolist()):
                i = ops.by_external.get(ext, -1)
                chain = ops.chain(i) if i >= 0 else []
                if cat == "gpu_memcpy":
                    c, b = ("layout copy" if "DtoD" in name else "host copy"), None
                elif cat == "gpu_memset":
                    c, b = "memset", None
                else:
                    key = (name, tuple(chain))
                    found = classes.get(key)
                    if found is None:
                        found = classes[key] = classify(name, chain)
                    c, b = found
                    if strided_elementwise(name):  # whatever its class: an elementwise add, a copy, a cast
                        strided[0] += 1
                        strided[1] += d
                klass.append(c)
                backend.append(b)
                dur.append(d)
                when.append(launched.get(corr, start))
                began.append(start)
                op_of.append(i)
    else:
        own = ops.self_time()
        for i, (name, d) in enumerate(zip(ops.ops.names, own.tolist())):
            if d <= 0 or not name.startswith("aten::"):
                continue
            c, b = classify(None, ops.chain(i))
            klass.append(c)
            backend.append(b)
            dur.append(d)
            when.append(int(ops.ops.ts[i]))
            began.append(int(ops.ops.ts[i]))
            op_of.append(i)
    if not klass:
        return {"missing": "no device work in this trace: neither GPU kernels nor CPU operators"}
    dur_a = np.asarray(dur, dtype=np.int64)
    step_idx = step_of(np.asarray(when, dtype=np.int64), spans) if spans else np.full(len(dur), -1)
    total = int(dur_a.sum())
    by_class = {}
    names = np.asarray(klass, dtype=object)
    for c in CLASSES:
        sel = names == c
        if sel.any():
            by_class[c] = {"us": us(dur_a[sel].sum()), "count": int(sel.sum()),
                           "share_pct": 100.0 * dur_a[sel].sum() / total if total else 0.0}
    out: dict = {"device": "gpu" if on_gpu else "cpu", "unit": "kernels" if on_gpu else "operators (own time)",
                 "total_us": us(total), "count": len(dur), "by_class": by_class}
    if spans:
        n_steps = len(spans)
        in_loop = step_idx >= 0
        out["per_step"] = {c: {"us": us(dur_a[in_loop & (names == c)].sum()) / n_steps,
                               "count": float((in_loop & (names == c)).sum()) / n_steps}
                           for c in CLASSES if (in_loop & (names == c)).any()}
        out["cpu_step_us"] = us(sum(e - s for _, s, e in spans)) / n_steps
        # a step's wall time is the device's: from the first piece of the loop's work to start to the last to end
        # (the host may run ahead of the device, so its own step spans can be shorter than the work they launched)
        start_a = np.asarray(began, dtype=np.int64)[in_loop]
        end_a = start_a + dur_a[in_loop]
        out["step_us"] = us(int(end_a.max()) - int(start_a.min())) / n_steps if on_gpu and in_loop.any() \
            else out["cpu_step_us"]
        out["steps"] = n_steps
    attention: dict[str, dict] = {}
    for b, d in zip(backend, dur):
        if b is not None:
            entry = attention.setdefault(b, {"us": 0.0, "count": 0})
            entry["us"] += us(d)
            entry["count"] += 1
    out["attention_backends"] = attention
    if on_gpu:
        out["strided_elementwise"] = {"count": strided[0], "us": us(strided[1])}
    # where each class comes from: the user-code line that called the outermost launching operator
    cache: dict[int, str] = {}
    sites: dict[str, Counter] = defaultdict(Counter)
    site_counts: dict[str, Counter] = defaultdict(Counter)
    for c, d, i in zip(klass, dur, op_of):
        if c in ("gemm", "attention", "norm", "elementwise", "layout copy", "reduction", "conv") and i >= 0:
            where = _site(frames, ops, i, cache) if frames else "(no Python stack)"
            sites[c][where] += d
            site_counts[c][where] += 1
    out["sites"] = {c: [{"site": s, "us": us(t), "count": site_counts[c][s]} for s, t in found.most_common(top)]
                    for c, found in sites.items()}
    out.update(_arithmetic(trace, ops, spans, frames, cache, klass, op_of, dur_a, out))
    return out


def _arithmetic(trace: Trace, ops: Ops, spans, frames: Frames | None, cache: dict[int, str], klass: list[str],
                op_of: list[int], dur_a: np.ndarray, found: dict) -> dict:
    """FLOPs, bytes, the roofline and strided inputs from the operators' shapes; `missing` without shapes."""
    dims_col = ops.ops.extra.get("dims")
    if dims_col is None or not any(d is not None for d in dims_col.tolist()[:2000]):
        why = "no operator shapes in this trace: profile with shapes (`lab profile` records them)"
        return {"flops": {"missing": why}, "strided_inputs": {"missing": why}, "roofline": {"missing": why}}
    names = ops.ops.names
    types_col, strides_col = ops.ops.extra["types"], ops.ops.extra["strides"]
    concrete_col = ops.ops.extra.get("concrete")
    n_steps = len(spans) or None
    step_idx = step_of(ops.ops.ts, spans) if spans else np.full(len(names), -1)
    flops_by = defaultdict(float)
    flops_step = defaultdict(float)
    dtypes: Counter = Counter()
    flop_rows = []
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
        flop_rows.append(i)
    # bytes per class: each launching operator's arguments once, in the class of its first piece of work
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
    main_dtype = dtypes.most_common(1)[0][0] if dtypes else None
    flops = {"total": float(sum(flops_by.values())), "by_class": dict(flops_by), "dtype": main_dtype,
             "bytes_by_class": dict(bytes_by)}
    if n_steps:
        flops["per_step"] = float(sum(flops_step.values())) / n_steps
        flops["per_step_by_class"] = {c: v / n_steps for c, v in flops_step.items()}
        flops["bytes_per_step_by_class"] = {c: v / n_steps for c, v in bytes_step.items()}
    out = {"flops": flops, "strided_inputs": _strided_inputs(ops, frames, cache, dims_col, strides_col, types_col,
                                                             step_idx, n_steps)}
    device = trace.device_properties[0].get("name") if trace.device_properties else None
    peak = peak_for(device) if found["device"] == "gpu" else None
    if peak is None:
        out["roofline"] = {"missing": f"no peak rates for {device!r} in lab/traces/peaks.py" if found["device"] == "gpu"
                           else "a CPU-only trace: the roofline is the GPU's"}
        return out
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
    out["roofline"] = {
        "gpu": peak.model, "dtype": main_dtype, "peak_tflops": rate / 1e12, "peak_tbs": peak.bandwidth_tbs,
        "source": peak.source, "per": "step" if n_steps else "trace", "by_class": rows,
        "floor_us": sum(r["floor_us"] for r in rows.values()),
        "mfu_pct": 100.0 * step_flops / (span_s * rate) if span_s and step_flops else None,
        "scale": scale,
    }
    return out


def _strided_inputs(ops: Ops, frames: Frames | None, cache: dict[int, str], dims_col, strides_col, types_col,
                    step_idx: np.ndarray, n_steps: int | None) -> dict:
    names = ops.ops.names
    found: dict[tuple[str, str], dict] = {}
    for i, name in enumerate(names):
        if strides_col[i] is None or not _STRIDE_OPS.match(name):
            continue
        if any(_STRIDE_OPS.match(names[a]) for a in ops.ancestors(i)):
            continue
        for arg, (d, s, t) in enumerate(zip(dims_col[i], strides_col[i], types_col[i] or ())):
            if not (isinstance(d, list) and isinstance(s, list) and len(d) >= 2 and len(d) == len(s)):
                continue
            if t not in _ELEMENT_BYTES or not needs_copy(name, arg, d, s):
                continue
            where = _site(frames, ops, i, cache) if frames else "(no Python stack)"
            entry = found.setdefault((where, name), {"site": where, "op": name, "count": 0, "in_loop": 0,
                                                     "argument": arg, "sizes": d, "strides": s})
            entry["count"] += 1
            entry["in_loop"] += int(step_idx[i] >= 0)
            break
    rows = sorted(found.values(), key=lambda r: -r["count"])
    return {"count": sum(r["count"] for r in rows), "per_step": (sum(r["in_loop"] for r in rows) / n_steps)
            if n_steps else None, "sites": rows[:20]}


def summary(work: dict, top: int = 5) -> dict:
    """The part of :func:`work_analysis` a result keeps: per step (or per call, without steps) time and count by
    class, attention backends, strided elementwise kernels, strided inputs, FLOPs and the roofline; sites only for the
    layout copies and strided inputs (the waste the lab hunts)."""
    if "missing" in work:
        return dict(work)
    per = "step" if work.get("per_step") else "call"
    out = {"device": work["device"], "unit": work["unit"], "per": per,
           "by_class": work["per_step"] if per == "step" else
           {c: {"us": v["us"], "count": v["count"]} for c, v in work["by_class"].items()},
           "step_us": work.get("step_us"), "cpu_step_us": work.get("cpu_step_us"),
           "attention_backends": work["attention_backends"],
           "layout_copy_sites": (work.get("sites") or {}).get(LAYOUT, [])[:top]}
    if "strided_elementwise" in work:
        out["strided_elementwise"] = work["strided_elementwise"]
    strided = work.get("strided_inputs") or {}
    out["strided_inputs"] = strided if "missing" in strided else {**strided, "sites": strided.get("sites", [])[:top]}
    flops = work.get("flops") or {}
    out["flops_per_step"] = flops.get("per_step") if "missing" not in flops else None
    roof = work.get("roofline") or {}
    out["roofline"] = roof if "missing" in roof else {k: roof[k] for k in
                                                      ("gpu", "dtype", "peak_tflops", "peak_tbs", "source", "per",
                                                       "floor_us", "mfu_pct", "by_class")}
    return out


def median_summary(summaries: list[dict]) -> dict:
    """Several profiled calls' summaries as one: each class's time and count the median over the calls (and the
    step's time and MFU likewise), the rest the first call's."""
    first = summaries[0]
    if "missing" in first or len(summaries) == 1:
        return first
    usable = [s for s in summaries if "missing" not in s]

    def median(values: list[float]) -> float:
        return float(np.median(values)) if values else 0.0

    out = dict(first)
    classes = {c for s in usable for c in s["by_class"]}
    out["by_class"] = {c: {k: median([s["by_class"].get(c, {}).get(k, 0.0) for s in usable]) for k in ("us", "count")}
                       for c in CLASSES if c in classes}
    steps_us = [s["step_us"] for s in usable if s.get("step_us") is not None]
    if steps_us:
        out["step_us"] = median(steps_us)
    mfus = [s["roofline"]["mfu_pct"] for s in usable if "missing" not in s["roofline"] and s["roofline"].get("mfu_pct")]
    if mfus and "missing" not in out["roofline"]:
        out["roofline"] = {**out["roofline"], "mfu_pct": median(mfus)}
    out["calls"] = len(usable)
    return out

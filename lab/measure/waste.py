"""GPU-side waste that a sync count cannot see, found by watching one call of a pipeline on any device.

One call runs under a `TorchFunctionMode` that looks at every matmul, linear, normalisation and attention call, and
with forward pre-hooks on the denoiser's repeated blocks. It finds, each with the file and line that made the call:

- **strided activations**: a block, a linear, a norm or an attention fed a tensor whose layout forces a copy (a
  linear or matmul whose input cannot be viewed as rows, a norm's input that is not contiguous, an attention input
  whose last dimension is not contiguous). Each is traced back to where the layout was made: the first operation
  that returned a non-contiguous tensor from contiguous inputs (a `transpose` after a patch embedding), which is
  the line a fix changes. On a GPU each costs a copy kernel or a strided kernel in every call that sees it, which the
  trace's device work confirms (`lab.traces.work`).
- **masks that mask nothing**: an attention mask that is all true (or all zero, added), which makes the attention
  take a kernel that accepts masks, or a slower one, for no effect.
- **grouped-query attention expanded by copies**: keys or values repeated to the query's heads
  (`repeat_interleave`, `repeat`) before the attention, where `enable_gqa` reads them as they are.
- **the attention backend and why**: on a GPU, what `torch.backends.cuda.can_use_*` says of each distinct call (the
  reasons a faster backend was refused); on a CPU only the inputs (the backend is the GPU's choice).
- **no repeated blocks**: a denoiser whose class names no `_repeated_blocks`, so regional compilation is impossible;
  the block classes to name.

Nothing here changes what the call computes: the watch reads shapes, strides and, for masks, their values.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from lab.base.console import routed_warnings
from lab.base.paths import package_parent, trim_path
from lab.run.runner import timed_call
from lab.run.scenario import Built
from lab.traces.work import needs_copy

#: kinds of site, in the order the pages list them
STRIDED_BLOCK = "strided block input"
STRIDED_LINEAR = "strided linear input"
STRIDED_NORM = "strided norm input"
STRIDED_ATTENTION = "strided attention input"
MASK_NOTHING = "mask masks nothing"
GQA_COPIES = "grouped-query attention expanded by copies"
NO_REPEATED = "no repeated blocks"
KINDS = (STRIDED_BLOCK, STRIDED_LINEAR, STRIDED_NORM, STRIDED_ATTENTION, MASK_NOTHING, GQA_COPIES, NO_REPEATED)
#: the lab's own package (its frames are never the caller; a diffusers unpacked in the lab's cache is)
_LAB = (package_parent() / "lab").as_posix() + "/"
STRIDED = (STRIDED_BLOCK, STRIDED_LINEAR, STRIDED_NORM, STRIDED_ATTENTION)

_LINEAR = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.baddbmm}
_NORMS = {F.layer_norm, F.group_norm, *((F.rms_norm,) if hasattr(F, "rms_norm") else ())}
_EXPANDS = {torch.repeat_interleave, torch.Tensor.repeat_interleave, torch.Tensor.repeat}
_SKIP = ("/torch/", "/contextlib.py", "/functools.py", "/_contextlib.py", "/typing.py")


@dataclasses.dataclass
class WasteSite:
    kind: str
    path: str
    line: int
    function: str
    detail: str
    count: int = 0
    origin: str | None = None  # where a strided layout was made: `path:line function (op)`

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} {self.function}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def caller(skip: tuple[str, ...] = _SKIP) -> tuple[str, int, str]:
    """The innermost frame outside torch, the lab and the standard library's wrappers: (path, line, function)."""
    own = _LAB
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not name.startswith(("<", own)) and not any(s in name for s in skip):
            return trim_path(name), frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return "(unknown)", 0, "?"


def costs_copy(op: str, x: torch.Tensor, arg: int = 0) -> bool:
    """Whether `x`, as argument `arg` of the aten operator `op`, costs a copy (the same rule the trace's strided
    inputs use: `lab.traces.work.needs_copy`)."""
    return x.dim() >= 2 and needs_copy(op, arg, list(x.shape), list(x.stride()))


def _layout(x: torch.Tensor) -> str:
    return f"{list(x.shape)} strides {list(x.stride())}"


def _describe_func(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    owner = getattr(func, "__objclass__", None) or getattr(func, "__self__", None)
    return f"Tensor.{name}" if owner is torch.Tensor or owner is torch._C.TensorBase else name


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


class WasteWatch(TorchFunctionMode):
    """The mode that looks at one call (the module's docstring); `sites` holds what it found."""

    def __init__(self, cuda: bool) -> None:
        super().__init__()
        self.cuda = cuda
        self.sites: dict[tuple[str, str, int, str], WasteSite] = {}
        self.origins: dict[int, tuple[weakref.ref, str]] = {}  # id(tensor) -> (ref, where its layout was made)
        self.expanded: dict[int, weakref.ref] = {}
        self.backends: dict[str, dict] = {}  # attention signature -> what the backends said

    # -- bookkeeping --------------------------------------------------------------------------------------------------

    def add(self, kind: str, detail: str, where: tuple[str, int, str] | None = None, origin: str | None = None) -> None:
        path, line, function = where or caller()
        key = (kind, path, line, detail)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = WasteSite(kind, path, line, function, detail, origin=origin)
        site.count += 1

    def origin_of(self, x: torch.Tensor) -> str | None:
        entry = self.origins.get(id(x))
        if entry is None or entry[0]() is not x:
            return None
        return entry[1]

    def _remember(self, out: Any, inputs: list[torch.Tensor], func: Any) -> None:
        """Where a non-contiguous result's layout was made: its input's origin, or this call when every input was
        contiguous."""
        for t in _tensors(out):
            if t.dim() < 2 or t.is_contiguous():
                continue
            inherited = next((o for o in map(self.origin_of, inputs) if o), None)
            if inherited is None:
                if any(not x.is_contiguous() for x in inputs if x.dim() >= 2):
                    continue
                path, line, function = caller()
                inherited = f"{path}:{line} {function} ({_describe_func(func)})"
            self.origins[id(t)] = (weakref.ref(t), inherited)

    # -- the mode -----------------------------------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LINEAR:
            x = args[0] if args else kwargs.get("input")
            if isinstance(x, torch.Tensor) and costs_copy("aten::linear", x):
                self.add(STRIDED_LINEAR, f"{_describe_func(func)} input {_layout(x)}", origin=self.origin_of(x))
        elif func in _NORMS:
            x = args[0] if args else kwargs.get("input")
            if isinstance(x, torch.Tensor) and costs_copy("aten::layer_norm", x):
                self.add(STRIDED_NORM, f"{func.__name__} input {_layout(x)}", origin=self.origin_of(x))
        elif func is F.scaled_dot_product_attention:
            self.attention(args, kwargs)
        out = func(*args, **kwargs)
        if func in _EXPANDS:
            for t in _tensors(out):
                self.expanded[id(t)] = weakref.ref(t)
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if isinstance(out, torch.Tensor) and not out.is_contiguous() and out.dim() >= 2:
            self._remember(out, inputs, func)
        elif isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
            self._remember(out, inputs, func)
        return out

    def _is_expanded(self, t: torch.Tensor) -> bool:
        for x in (t, getattr(t, "_base", None)):
            if x is not None and (ref := self.expanded.get(id(x))) is not None and ref() is x:
                return True
        return False

    def attention(self, args: tuple, kwargs: dict) -> None:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, args)) | kwargs
        q, k, v, mask = bound.get("query"), bound.get("key"), bound.get("value"), bound.get("attn_mask")
        where = caller()
        for label, x in (("query", q), ("key", k), ("value", v)):
            if isinstance(x, torch.Tensor) and costs_copy("aten::scaled_dot_product_attention", x):
                self.add(STRIDED_ATTENTION, f"{label} {_layout(x)}", where, self.origin_of(x))
        if isinstance(mask, torch.Tensor) and mask.numel():
            nothing = bool(mask.all()) if mask.dtype == torch.bool else bool((mask == 0).all())
            if nothing:
                self.add(MASK_NOTHING, f"{'bool' if mask.dtype == torch.bool else str(mask.dtype)} mask "
                                       f"{list(mask.shape)}, queries {list(q.shape)}", where)
        for label, x in (("key", k), ("value", v)):
            if isinstance(x, torch.Tensor) and self._is_expanded(x) and not bound.get("enable_gqa"):
                self.add(GQA_COPIES, f"{label} {list(x.shape)} repeated to the query's heads", where)
        signature = (f"{list(q.shape)} {str(q.dtype).removeprefix('torch.')}"
                     + (f", mask {list(mask.shape)} {str(mask.dtype).removeprefix('torch.')}"
                        if isinstance(mask, torch.Tensor) else "") + f" at {where[0]}:{where[1]}")
        entry = self.backends.get(signature)
        if entry is None:
            entry = self.backends[signature] = {"calls": 0, **(backend_reasons(q, k, v, mask, bound) if self.cuda
                                                               else {})}
        entry["calls"] += 1


def backend_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bound: dict) -> dict:
    """What `torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention` say of one call on the GPU: each backend's
    yes or the warnings that give its reasons no."""
    cuda = torch.backends.cuda
    try:
        params = cuda.SDPAParams(q, k, v, mask, float(bound.get("dropout_p") or 0.0), bool(bound.get("is_causal")),
                                 bool(bound.get("enable_gqa")))
    except TypeError:  # torch before `enable_gqa`
        params = cuda.SDPAParams(q, k, v, mask, float(bound.get("dropout_p") or 0.0), bool(bound.get("is_causal")))
    out = {}
    for backend, check in (("flash", "can_use_flash_attention"), ("efficient", "can_use_efficient_attention"),
                           ("cudnn", "can_use_cudnn_attention")):
        fn = getattr(cuda, check, None)
        if fn is None:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = bool(fn(params, True))
        out[backend] = "yes" if ok else "; ".join(dict.fromkeys(str(w.message).strip() for w in caught)) or "no"
    return out


def block_classes(model: torch.nn.Module) -> list[str]:
    """The classes of the denoiser's repeated blocks: its `_repeated_blocks`, else the classes that fill its
    module lists (what `_repeated_blocks` would name)."""
    named = list(getattr(model, "_repeated_blocks", None) or ())
    if named:
        return named
    found: list[str] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            name = type(module[0]).__name__
            if all(type(m).__name__ == name for m in module) and name not in found:
                found.append(name)
    return found


def _block_hook(watch: WasteWatch, name: str) -> Callable:
    def hook(module, args, kwargs):
        where = caller()
        inputs = list(zip(("hidden_states",) + tuple(f"argument {i}" for i in range(1, len(args))), args))
        inputs += [(k, v) for k, v in kwargs.items()]
        for label, x in inputs:
            if isinstance(x, torch.Tensor) and x.dim() >= 3 and not x.is_contiguous():
                watch.add(STRIDED_BLOCK, f"{name}.{label} {_layout(x)}", where, watch.origin_of(x))
    return hook


def repeated_blocks_site(model: torch.nn.Module) -> WasteSite | None:
    """A site for a denoiser without `_repeated_blocks` (regional compilation impossible), naming what to add."""
    if getattr(model, "_repeated_blocks", None):
        return None
    cls = type(model)
    try:
        path, line = trim_path(inspect.getsourcefile(cls) or "?"), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        path, line = cls.__module__, 0
    names = block_classes(model)
    detail = (f"add `_repeated_blocks = {names!r}` to `{cls.__name__}`" if names else
              f"`{cls.__name__}` has no module list of repeated blocks")
    return WasteSite(NO_REPEATED, path, line, cls.__name__, detail, count=1)


def watch_call(built: Built, seed: int, progress: Callable[[str], None] | None = None) -> dict:
    """One call under the watch (after the call the caller warmed up with): the sites found, the attention
    signatures and what the backends said, and the block classes."""
    model = getattr(built.pipe, built.scenario.denoiser)
    watch = WasteWatch(cuda=built.device.startswith("cuda"))
    classes = set(block_classes(model))
    handles = [m.register_forward_pre_hook(_block_hook(watch, type(m).__name__), with_kwargs=True)
               for m in model.modules() if type(m).__name__ in classes]
    if progress is not None:
        progress("one call watched for strided activations, masks and attention backends ...")
    from lab.apply.coverage import eager

    try:
        with eager(), watch:  # compiled code runs its Python eagerly, so that the watch sees every call
            timed_call(built, seed=seed, marks=False)
    finally:
        for h in handles:
            h.remove()
    sites = sorted(watch.sites.values(), key=lambda s: (KINDS.index(s.kind), -s.count, s.path, s.line))
    repeated = repeated_blocks_site(model)
    if repeated is not None:
        sites.append(repeated)
    return {"sites": [s.to_dict() for s in sites], "attention": watch.backends,
            "blocks": sorted(classes), "denoiser": type(model).__name__,
            "backend_note": None if watch.cuda else "a CPU run: the attention backend is the GPU's choice, shown by "
                                                    "a GPU trace's device work"}


def summary(found: dict) -> dict[str, int]:
    """Calls per kind of site."""
    out = {k: 0 for k in KINDS}
    for s in found.get("sites", []):
        out[s["kind"]] += s["count"]
    return out


def where_made(found: dict) -> list[str]:
    """The distinct lines that made a strided layout that reached a block, linear, norm or attention."""
    return sorted({s["origin"] for s in found.get("sites", []) if s["kind"] in STRIDED and s.get("origin")})



@contextlib.contextmanager
def compiler_notes(found: dict) -> Iterator[None]:
    """The compiler's warnings (an `lru_cache`-wrapped function traced, a builtin it cannot trace) and graph breaks
    by reason, for the calls inside (the ones that compile): into `found["warnings"]` (message -> count) and
    `found["graph_breaks"]` (reason -> count). Other warnings are shown as usual."""
    from torch._dynamo import utils

    counters = utils.counters
    # the compiler says each warning once per process: forget what it said for an earlier pipeline
    getattr(utils, "warn_once_cache", set()).clear()
    before = collections.Counter(counters["graph_break"])
    caught: collections.Counter[str] = collections.Counter()

    def take(message: str, filename: str) -> bool:
        if "/torch/_dynamo/" in filename.replace("\\", "/") or "dynamo" in message.lower():
            caught[" ".join(message.split())[:400]] += 1
            return True
        return False

    with routed_warnings(take):
        try:
            yield
        finally:
            found["warnings"] = dict(caught.most_common())
            after = collections.Counter(counters["graph_break"])
            found["graph_breaks"] = {reason: n - before.get(reason, 0) for reason, n in after.most_common()
                                     if n > before.get(reason, 0)}

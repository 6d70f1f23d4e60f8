"""Model CPU offload: keep the host weights in pinned memory and move them to the device without a wait.

With `model_offload_keep_host` the copy back after a call is gone, and what an offloaded call still pays is the move
to the device: one blocking copy per tensor from pageable memory, most of it in the first step. A copy from pinned
(page-locked) memory runs at the link's speed, and need not block the host. This fix does what
`model_offload_keep_host` does (offload by pointing the parameters back at their host tensors: nothing copied back)
with those host tensors in pinned memory: each plain, contiguous host weight of an offloaded model is copied into a
pinned buffer and its parameter pointed there, and the move is `module.to(device, non_blocking=True)`, so the host
goes on to queue the forward while the copies run before it, in stream order. Buffers, tensor subclasses (quantized
weights) and parameters changed on the device move as upstream. Outputs are bit-identical: the same values.

The cost is memory that cannot be swapped: a model's weights stay page-locked for as long as the pipeline lives,
which group offloading's stream path pays too (in blocks: `fixes/_offload.py`). Upstream would pin once, when
offloading is enabled; the lab pins when the fix is switched on, before the call it times, each offloaded model whose
weights are on the host then (a model on the device is pinned at its next move, inside a call). It keeps each
weight's pageable tensor, so that turning the fix off gives the pipeline back as it was, and the pinned space, so
that an A/B's many arm switches allocate nothing more: host memory holds the weights twice. Between two turns of the
fix the other arm's calls copy the weights back into new pageable tensors (upstream's offload), so each turn copies
them into the same pinned space again, at its switch-on; a weight whose tensor and version did not change is not
copied again. A weight replaced while the fix is on (`model.to(torch.bfloat16)`) is pinned anew at its next move, and
the replacement is what the fix gives back on exit. A write through `param.data` while the fix is off (an alias with
its own version counter) is not seen, and the lab changes no weight between an A/B's turns. While the fix is on, a
host write lands in the pinned copy itself.

`CpuOffload.pre_forward` is accelerate's (1.15.0, `accelerate/hooks.py`); the patch runs its steps (offload the
previous model, skip a model already there, move, move the inputs) with the pinning and the non-blocking move, and
conflicts with `model_offload_keep_host` (both offload by pointing back; this one includes it). Its upstream change
is accelerate's, after `model_offload_keep_host`'s (`patches/accelerate/model_offload_pinned.md`). On the CPU,
`tests/test_model_offload_pinned.py` runs it with stand-ins for the pinned memory and the device copies.
"""

import weakref

from fixes._offload import forget_the_gone, offload_by_pointing_back, pinned_for, pinned_of, release_pinned
from lab.apply import EVERY, Fix, Upstream

EXERCISED = "CpuOffload offload (parameters pointed back at their pinned host tensors)"


def _pin(param, swapped: dict):
    """Point a host parameter at its pinned copy (`pinned_for`); remember what it pointed at, for the fix's exit (the
    latest such tensor: a weight replaced while the fix is on is given back replaced). None where the parameter is
    not a plain, contiguous host tensor."""
    data = param.data
    view = pinned_for(param)
    if view is not None and view.data_ptr() != data.data_ptr():
        swapped[param] = data
        param.data = view
    return view


def runtime(pipe, patcher) -> None:
    """Accelerate's `CpuOffload` moves from pinned copies without a wait and offloads by pointing back at them."""
    import torch
    from accelerate.hooks import CpuOffload, UserCpuOffloadHook, send_to_device
    from accelerate.utils.memory import clear_device_cache

    kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook -> {parameter: (pinned, its move)}
    swapped: dict = {}  # parameter -> the pageable tensor it pointed at before this turn of the fix

    @torch.compiler.disable
    def pinned_pre_forward(self, module, *args, **kwargs):
        # accelerate 1.15.0's `CpuOffload.pre_forward`, with the pinning and a non-blocking move
        if self.prev_module_hook is not None and isinstance(self.prev_module_hook, UserCpuOffloadHook):
            if next(self.prev_module_hook.model.parameters()).device != torch.device("cpu"):
                self.prev_module_hook.offload()
                clear_device_cache()
        if next(module.parameters()).device == self.execution_device:
            return args, kwargs
        host = {} if self in kept else {p: _pin(p, swapped) for p in module.parameters()}
        module.to(self.execution_device, non_blocking=True)
        if self not in kept:
            kept[self] = {p: (t, p.data_ptr(), p._version) for p, t in host.items() if t is not None}
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)

    def give_back() -> None:  # the pipeline as it was: each parameter on its pageable tensor again
        for param, pageable in swapped.items():
            known = pinned_of(param)
            if known is not None and param.data.data_ptr() == known[0].data_ptr():
                param.data = pageable
        swapped.clear()

    patcher.setattr(CpuOffload, "pre_forward", pinned_pre_forward)
    offload_by_pointing_back(patcher, kept, EXERCISED)  # as `model_offload_keep_host`, at the pinned copies
    patcher.on_restore(give_back)
    forget_the_gone()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # no copy still reads the pinned space that pinning writes again
    for module in offloaded_models(pipe):  # upstream would pin once, at `enable_model_cpu_offload`: before the call
        for param in module.parameters():
            _pin(param, swapped)


def offloaded_models(pipe) -> list:
    """The pipeline's models that accelerate's `CpuOffload` moves (model CPU offload's hooks)."""
    import torch
    from accelerate.hooks import CpuOffload

    def hooks(module) -> list:  # accelerate appends a hook to one there before as a `SequentialHook`
        hook = getattr(module, "_hf_hook", None)
        return list(getattr(hook, "hooks", None) or [hook])

    return [m for m in pipe.components.values()
            if isinstance(m, torch.nn.Module) and any(isinstance(h, CpuOffload) for h in hooks(m))]


FIX = Fix(
    name="model_offload_pinned",
    description="Model CPU offload keeps each model's host weights in pinned memory, moves them to the device without "
                "a wait and offloads by pointing the parameters back at them (no copy back).",
    upstream=Upstream(refs=(), note="found by the lab; the moves are accelerate's `CpuOffload` (accelerate 1.15), "
                                    "so the change belongs there: patches/accelerate/ (after model_offload_keep_host's), "
                                    "with diffusers follow-ups (the pin_memory option, and model_offload_keep_host's "
                                    "offload through the hooks at the end of a call)", overlaps=()),
    pipelines=EVERY,
    setting="model_cpu_offload",
    runtime=runtime,
    runtime_targets=("accelerate.hooks.CpuOffload.pre_forward, init_hook and detach_hook",
                     "diffusers.DiffusionPipeline.maybe_free_model_hooks"),
    exercised_by=(EXERCISED,),
    conflicts=("model_offload_keep_host",),
    includes=("model_offload_keep_host",),
    tried_on="flux",
    release=release_pinned,
)

"""Model CPU offload: offload a model by pointing its weights back at the host tensors they were copied from.

`enable_model_cpu_offload()` moves each model to the device in the accelerate hook's `pre_forward`
(`CpuOffload`, `module.to(device)`) and back when the next model in the sequence runs (`UserCpuOffloadHook.offload`,
`module.to("cpu")`) or at the end of the call (`maybe_free_model_hooks` enables the offload again: its
`remove_all_hooks()` and `self.to("cpu")`). The way back is a blocking device-to-host copy per tensor, into newly
allocated pageable memory, of weights that never changed on the device: FLUX.1 makes 1,160 of them per call (H100),
and its offloaded call spends 18 s of 20 s outside the transformer's forwards (FINDINGS, "Model CPU offload, every set
eager"). Group offloading's stream path already avoids the copy back, and `group_offload_keep_host` does it without a
stream.

This does the same for model offloading. Before the hook moves a model to the device, the host tensors of its
parameters are kept (no copy: they are the parameters' own); when the hook offloads it, or diffusers removes the hook
at the end of the call, the parameters are pointed back at them, so the `.to("cpu")` that follows copies nothing but
the buffers (a forward may write to one), and tensor subclasses (quantized weights), which assignment does not
restore, move as before. Outputs are bit-identical: the same values, never copied back. The kept tensors are the ones
each move copied from, taken again at every move, so a weight a user changes between calls (fusing a LoRA, loading
others) is what the next call keeps. The contract is the stream path's: a parameter is not changed in place on the
device while offloading is on (nor moved by hand between the hook's move and its offload). Host memory holds a model's weights while it is on the device, where upstream frees
them until the copy back allocates them again.

The code is accelerate's (`accelerate/hooks.py`, `CpuOffload`), which diffusers calls, so the change belongs there:
the lab patches the hook's class at run time (every hook, also those made before the fix is on, and the ones
`maybe_free_model_hooks` makes anew in every call), keeps the host tensors outside accelerate's objects, counts the
offloads that point back (the proof that it ran) and gives everything back on exit. No diffusers diff is written.
On the CPU, `tests/test_model_offload_keep_host.py` runs the real hooks with a stand-in for the device copies.
"""

import weakref

from lab.apply import EVERY, Fix, Upstream

EXERCISED = "CpuOffload offload (parameters pointed back at their host tensors)"


def runtime(pipe, patcher) -> None:
    """Accelerate's `CpuOffload` keeps the host tensors of each move to the device and offloads by pointing back."""
    import torch
    from accelerate.hooks import CpuOffload

    kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook -> {parameter: its host tensor}
    pre_forward, init_hook, detach_hook = CpuOffload.pre_forward, CpuOffload.init_hook, CpuOffload.detach_hook
    counter = patcher.counter

    @torch.compiler.disable
    def keeping_pre_forward(self, module, *args, **kwargs):
        first = next(module.parameters(), None)
        # where the hook moves the model (its own test), the tensors it copies from: the first move of a stay
        if self not in kept and first is not None and first.device != self.execution_device:
            kept[self] = {p: p.data for p in module.parameters() if type(p.data) is torch.Tensor}
        return pre_forward(self, module, *args, **kwargs)

    def point_back(self) -> None:
        host = kept.pop(self, None)
        if host:
            for param, tensor in host.items():
                param.data = tensor
            if counter is not None:
                counter.counts[EXERCISED] += 1

    def pointing_init_hook(self, module):  # `UserCpuOffloadHook.offload`: the next model in the sequence runs
        point_back(self)
        return init_hook(self, module)

    def pointing_detach_hook(self, module):  # `remove_all_hooks()`, before `maybe_free_model_hooks`'s `.to("cpu")`
        point_back(self)
        return detach_hook(self, module)

    patcher.setattr(CpuOffload, "pre_forward", keeping_pre_forward)
    patcher.setattr(CpuOffload, "init_hook", pointing_init_hook)
    patcher.setattr(CpuOffload, "detach_hook", pointing_detach_hook)


FIX = Fix(
    name="model_offload_keep_host",
    description="Model CPU offload offloads each model by pointing its parameters back at the host tensors they were "
                "copied from, instead of a blocking device-to-host copy of every weight after every call.",
    upstream=Upstream(refs=(), note="found by the lab; the copy back is accelerate's `CpuOffload` (accelerate 1.15), "
                                    "so the change belongs there: no diffusers diff"),
    pipelines=EVERY,
    setting="model_cpu_offload",
    runtime=runtime,
    runtime_targets=("accelerate.hooks.CpuOffload.pre_forward, init_hook and detach_hook",),
    exercised_by=(EXERCISED,),
)

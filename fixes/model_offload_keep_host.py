"""Model CPU offload: offload a model by pointing its weights back at the host tensors they were copied from.

`enable_model_cpu_offload()` moves each model to the device in the accelerate hook's `pre_forward`
(`CpuOffload`, `module.to(device)`) and back when the next model in the sequence runs (`UserCpuOffloadHook.offload`,
`module.to("cpu")`) or at the end of the call (`maybe_free_model_hooks` enables the offload again: its
`remove_all_hooks()` and `self.to("cpu")`). The way back is a blocking device-to-host copy per tensor, into newly
allocated pageable memory, of weights that never changed on the device, after every call; it is most of what an
offloaded call spends outside the forwards. Group offloading's stream path already avoids the copy back, and
`group_offload_keep_host` does it without a stream.

This does the same for model offloading. Before the hook moves a model to the device, the host tensors of its
parameters are kept (no copy: they are the parameters' own); when the hook offloads it (the next model runs, or the
end of the call, where `maybe_free_model_hooks` now offloads each model through its hook before it removes the
hooks), the parameters are pointed back at them, so the `.to("cpu")` that follows copies nothing but the buffers (a
forward may write to one), and tensor subclasses (quantized weights), which assignment does not
restore, move as before. Outputs are bit-identical: the same values, never copied back. The kept tensors are the ones
each move copied from, taken again at every move, so a weight a user changes between calls (a cast, fusing a LoRA,
loading others) is what the next call keeps. A parameter that changed on the device between the move and the offload
is left for the copy back, as upstream: one that points elsewhere (`param.data = ...`, a cast, a move by hand) or
whose version counter moved (an in-place write to the parameter, `load_state_dict`'s `copy_`). Both checks read host
metadata only. A write through `param.data` (an alias with its own counter) escapes them: the contract there is the
stream path's, that such a write is not made while offloading is on. The cost: host memory holds a model's weights
while it is on the device, where upstream frees them until the copy back allocates them again.

Removing a hook (`remove_hook_from_module`) leaves its model where it is, as upstream: on the device, the kept host
tensors let go (accelerate's own `test_cpu_offload_hook_moves_model` holds it).

The code is accelerate's (`accelerate/hooks.py`, `CpuOffload`), which diffusers calls, so the change belongs there:
the lab patches the hook's class at run time (every hook, also those made before the fix is on, and the ones
`maybe_free_model_hooks` makes anew in every call), keeps the host tensors outside accelerate's objects, counts the
offloads that point back (the proof that it ran) and gives everything back on exit. The same change to accelerate
1.15.0 is `patches/accelerate/model_offload_keep_host.diff`, written by hand, and the end of the call's offload
through the hooks is diffusers' follow-up, `patches/accelerate/model_offload_keep_host_diffusers.diff` (with a
released accelerate it changes nothing: the hook's offload is the same `.to("cpu")`).
On the CPU, `tests/test_model_offload_keep_host.py` runs the real hooks with a stand-in for the device copies.
"""

import weakref

from fixes._offload import offload_by_pointing_back
from lab.apply import EVERY, Fix, Upstream

EXERCISED = "CpuOffload offload (parameters pointed back at their host tensors)"


def runtime(pipe, patcher) -> None:
    """Accelerate's `CpuOffload` keeps the host tensors of each move to the device and offloads by pointing back."""
    import torch
    from accelerate.hooks import CpuOffload

    kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook -> {parameter: (host tensor, its move)}
    pre_forward = CpuOffload.pre_forward

    @torch.compiler.disable
    def keeping_pre_forward(self, module, *args, **kwargs):
        first = next(module.parameters(), None)
        # where the hook moves the model (its own test), the tensors it copies from: the first move of a stay
        moving = self not in kept and first is not None and first.device != self.execution_device
        host = {p: p.data for p in module.parameters() if type(p.data) is torch.Tensor} if moving else None
        out = pre_forward(self, module, *args, **kwargs)
        if host:  # what each parameter is on the device right after the move: its storage and its version
            kept[self] = {p: (tensor, p.data_ptr(), p._version) for p, tensor in host.items()}
        return out

    patcher.setattr(CpuOffload, "pre_forward", keeping_pre_forward)
    offload_by_pointing_back(patcher, kept, EXERCISED)


FIX = Fix(
    name="model_offload_keep_host",
    description="Model CPU offload offloads each model by pointing its parameters back at the host tensors they were "
                "copied from, instead of a blocking device-to-host copy of every weight after every call.",
    upstream=Upstream(refs=(), note="found by the lab; the copy back is accelerate's `CpuOffload` (accelerate 1.15), "
                                    "so the change belongs there: patches/accelerate/, with a diffusers follow-up "
                                    "that offloads through the hooks at the end of a call",
                      overlaps=()),
    pipelines=EVERY,
    setting="model_cpu_offload",
    runtime=runtime,
    runtime_targets=("accelerate.hooks.CpuOffload.pre_forward, init_hook and detach_hook",
                     "diffusers.DiffusionPipeline.maybe_free_model_hooks"),
    exercised_by=(EXERCISED,),
    tried_on="flux",
)

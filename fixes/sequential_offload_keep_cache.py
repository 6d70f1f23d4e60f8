"""Sequential CPU offload loads each weight without emptying the device's memory cache.

`enable_sequential_cpu_offload` gives every leaf module accelerate's `AlignDevicesHook`, whose `pre_forward` loads
each weight with `set_module_tensor_to_device`, and that function ends with `clear_device_cache()`
(`torch.cuda.empty_cache()`) whenever the device is an accelerator and its `clear_cache` argument is left at `True`,
as the hook leaves it: once per weight, in every forward of every leaf module. The hook's `post_forward` has just
freed the previous module's weights into PyTorch's caching allocator, so each `empty_cache` hands them back to the
driver (`cudaFree`, which waits for the whole device) and the next load allocates them again (`cudaMalloc`). The
lab's sync count does not see it: `cudaFree` is not one of the calls it counts (`cudaStreamSynchronize`,
`cudaDeviceSynchronize`, `cudaEventSynchronize`, a blocking `cudaMemcpy`), though it waits. Found by the lab while
writing `sequential_offload_pinned`.

The runtime patch passes `clear_cache=False` for the hook's loads (a weight with a value to load): the freed blocks
stay in the cache for the next module's weights. Outputs are bit-identical. What it may cost is memory held by the
cache between loads (reserved, not allocated) that other processes on the device cannot use; the cache still empties
when PyTorch needs the memory back. Alone it gains little where loads from pageable memory wait anyway; with
`sequential_offload_pinned`'s loads, which do not, this wait is what is left, so the two are timed alone and together.
A cast after offloading (`model.to(torch.bfloat16)`) is the hook's own: each load casts the host value to the
parameter's dtype, as upstream. The upstream diff is `patches/accelerate/sequential_offload_keep_cache.diff`.

`set_module_tensor_to_device` is accelerate's (1.15.0, `accelerate/utils/modeling.py`, called by
`accelerate/hooks.py`). On the CPU, `tests/test_sequential_offload_pinned.py` runs it under accelerate's sequential
offload.
"""

from fixes._offload import pass_to_loads
from lab.apply import EVERY, Fix, Overlap, Upstream

EXERCISED = "set_module_tensor_to_device (a weight loaded without emptying the device cache)"


def runtime(pipe, patcher) -> None:
    """The hook's loads keep the device's memory cache: a load from the host state dict (`pre_forward`) has a value;
    a move to `meta` has none and clears nothing."""
    pass_to_loads(patcher, EXERCISED, lambda device, value: value is not None, clear_cache=False)


FIX = Fix(
    name="sequential_offload_keep_cache",
    description="Sequential CPU offload loads each weight without emptying the device's memory cache "
                "(`torch.cuda.empty_cache()` once per weight upstream).",
    upstream=Upstream(refs=(), note="found by the lab; the loads are accelerate's `AlignDevicesHook` (accelerate "
                                    "1.15), so the change belongs there: patches/accelerate/, no diffusers diff",
                      overlaps=(
        Overlap("accelerate#3796", "merged",
                "skips the cache flush when offloading to `meta` (the hook's offload side); this diff removes it on "
                "the load side: complementary"),
    )),
    pipelines=EVERY,
    setting="sequential_cpu_offload",
    runtime=runtime,
    runtime_targets=("accelerate.hooks.set_module_tensor_to_device (as AlignDevicesHook.pre_forward calls it)",),
    exercised_by=(EXERCISED,),
    tried_on="flux",
)

"""Group offloading (`pipe.enable_group_offload(...)`): groups of blocks, or leaf modules, onloaded for their
forward, optionally on a side stream."""

from __future__ import annotations

from typing import Any

from lab.run.settings.hooks import hook_snapshot, restore_hooks
from lab.run.settings.kind import Kind, Range, Target, Undo
from lab.run.settings.model_offload import ON_CPU


def _group_offload(built: Any, options: dict) -> Undo:
    import torch

    pipe, device = built.pipe, built.device
    kwargs = {"onload_device": torch.device(device), "offload_device": torch.device("cpu"),
              "offload_type": options["level"], "use_stream": options["stream"],
              "non_blocking": options["stream"], "record_stream": options["record_stream"]}
    if options["level"] == "block_level":
        kwargs["num_blocks_per_group"] = options["blocks"]
    snapshots = [hook_snapshot(c) for c in pipe.components.values() if isinstance(c, torch.nn.Module)]
    pipe.enable_group_offload(**kwargs)

    def undo() -> None:
        for snapshot in snapshots:
            restore_hooks(snapshot)
        pipe.to(device)

    return undo


def _group_offload_check(target: Target, options: dict) -> str | None:
    # record_stream spares each group's offload its wait for the compute stream (`_offload_to_memory`), a sync per
    # group and call; it marks the weights used on that stream, so there must be a side stream to begin with
    if options["record_stream"] and not options["stream"]:
        return "`record_stream` marks the onloaded weights as used by the compute stream, so it needs `stream`"
    return None


KINDS = (
    Kind("group_offload", "groups of blocks (or leaf modules) onloaded for their forward, optionally on a side stream",
         "pipe.enable_group_offload(...)",
         options={"level": "block_level", "blocks": 1, "stream": False, "record_stream": False},
         ranges={"blocks": Range(1, None, "the blocks in each group (`num_blocks_per_group`)")},
         choices={"level": ("block_level", "leaf_level")}, accelerator_only=ON_CPU, check=_group_offload_check,
         apply=_group_offload),
)

"""The one table of settings (`SETTINGS`, name -> `Kind`, in the order `lab settings` prints them), each technique's
kinds from its own module, and what the grammar and the undo need to know of them: which settings exclude each
other (one cache and one offloading at a time) and which are made again exactly when turned off and on."""

from __future__ import annotations

from lab.run.settings import (attention_backend, caches, group_offload, layerwise_casting, lora, model_offload,
                              quantized, sequential_offload)
from lab.run.settings.kind import Kind

SETTINGS: dict[str, Kind] = {k.name: k for module in (caches, model_offload, sequential_offload, group_offload,
                                                      layerwise_casting, quantized, attention_backend, lora)
                             for k in module.KINDS}
CACHES = ("first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache", "mag_cache", "faster_cache")


#: the settings that turning off and on again makes exactly as before (`without`)
REMADE_EXACTLY = ("first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache", "faster_cache")


GROUP = {**{n: "cache" for n in CACHES},
          **{n: "offloading" for n in ("model_cpu_offload", "sequential_cpu_offload", "group_offload")}}

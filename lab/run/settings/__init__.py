"""The settings users run: a memory or speed feature of diffusers turned on over a built pipeline, through diffusers'
own public API, the same in both arms (`--setting NAME[:OPTIONS]`).

A setting is parsed from its text (`grammar`), checked against the scenario and the device before anything is
built (a refusal is one `UsageError` naming the setting, the pipeline and the reason), applied after the build
(`apply`, which returns its undo: `lifecycle`) and named in the result (`Setting.tag`), so that results in different
settings never replace each other. Each technique is a module of its own (`caches`, `model_offload`,
`sequential_offload`, `group_offload`, `layerwise_casting`, `quantized`, `attention_backend`, `lora`), registered
in one table, `SETTINGS` (`catalog`; `lab settings` prints it), as diffusers keeps each hook in a module of
`diffusers.hooks`. This package is the one door: the lab imports these names from `lab.run.settings`.
"""

from lab.run.settings.attention_backend import masks_refused
from lab.run.settings.catalog import GROUP, SETTINGS
from lab.run.settings.grammar import parse, parse_all
from lab.run.settings.hooks import hook_count
from lab.run.settings.kind import Guidance, Kind, Range, Setting, Target, Undo
from lab.run.settings.lifecycle import DECIDED, apply, check, decisions, refusal, tags, without
from lab.run.settings.lora import LORA_TARGETS
from lab.run.settings.quantized import QUANT_TYPES

__all__ = ["DECIDED", "GROUP", "LORA_TARGETS", "QUANT_TYPES", "SETTINGS", "Guidance", "Kind", "Range", "Setting",
           "Target", "Undo", "apply", "check", "decisions", "hook_count", "masks_refused", "parse", "parse_all", "refusal",
           "tags", "without"]

"""What a setting is: its kind (`Kind`: what it does, its options and how it is checked and applied), a kind with
its options chosen (`Setting`), what it is checked against before a build (`Target`, and the pipeline's `Guidance`),
and the values an option takes (`Range`)."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
from typing import Any, Callable, ContextManager

Undo = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class Target:
    """What a setting is checked against before the build: the pipeline class and its transformer's class."""

    pipeline_cls: type
    transformer_cls: type | None
    #: the transformer's tiny config: a cache is tried on a copy of it made on the meta device (no memory, no
    #: weights), so that one whose hooks would match no module is refused before anything is built
    tiny_config: dict[str, Any] | None = None
    #: the pipeline hands some steps to a second denoiser (Wan 2.2's `transformer_2`), which a setting does not reach
    second_denoiser: bool = False
    #: how the pipeline runs classifier-free guidance, read off its tiny build when first asked
    #: (`lab.run.scenario.guidance_of`); None: not known
    guidance: Callable[[], Guidance | str] | None = None
    #: whether the denoiser gives its attention a mask, read off the same tiny call (`lab.run.scenario.
    #: attention_mask_of`; None: not known)
    attention_mask: Callable[[], bool | None] | None = None


@dataclasses.dataclass(frozen=True)
class Range:
    """The values diffusers takes for a numeric option, `low` to `high` (None: no bound), and why: what its code
    does with the option (a block cache computes every N-th call by `iteration % N`, so N must be at least 1)."""

    low: float | None = None
    high: float | None = None
    why: str = ""

    def __contains__(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        return (f"{'(-inf' if self.low is None else f'[{self.low:g}'}, "
                f"{'inf)' if self.high is None else f'{self.high:g}]'}")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One setting: what it does, its options (name -> default; a bool option is turned on by its bare name, a
    `choice` option takes one of its words bare), and how it is checked and applied."""

    name: str
    does: str
    api: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # option -> its bare words
    #: numeric option -> the values diffusers takes (any finite number where an option has none)
    ranges: dict[str, Range] = dataclasses.field(default_factory=dict)
    accelerator_only: str | None = None  # why it cannot run on a CPU, if it cannot
    #: (options, device) -> why these options cannot run on this device, or None (`quantized:float8dq` needs sm_89)
    device_check: Callable[[dict, str], str | None] | None = None
    #: (options) -> what this host lacks for it (a package), or None: asked where it runs, not where a campaign file
    #: is planned (a GPU host may have what the planning machine does not)
    host_check: Callable[[dict], str | None] | None = None
    #: (what it is turned on for, options) -> why not, or None
    check: Callable[[Target, dict], str | None] | None = None
    apply: Callable[[Any, dict], Undo] = None  # (the built pipeline, options) -> undo
    positional: str | None = None  # the option a bare word sets (`attention_backend:flex`)
    #: how the output check works in this setting
    verify: str = "outputs bit-identical within the tolerance, as without a setting"
    #: () -> a context in which the setting's decisions from the data are counted (a cache that skips work when
    #: what it reads changed little): what each arm's verifying call decided, so that a page says whether the cache
    #: skipped at all (with random weights it may never)
    decides: Callable[[], ContextManager[collections.Counter]] | None = None


@dataclasses.dataclass(frozen=True)
class Setting:
    kind: Kind
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kind.name

    def tag(self) -> str:
        """The setting in a result name: `first_block_cache`, `group_offload-leaf_level-stream`,
        `first_block_cache-threshold0.2` (options that differ from their default, in the catalog's order)."""
        parts = [self.kind.name]
        for key, default in self.kind.options.items():
            value = self.options[key]
            if value == default:
                continue
            if key in self.kind.choices or key == self.kind.positional:
                parts.append(str(value))
            elif isinstance(default, bool):
                parts.append(key if value else f"no_{key}")
            else:
                parts.append(f"{key}{value}")
        return "-".join(parts)

    def describe(self) -> str:
        """`first_block_cache (threshold=0.2)`: the setting with every option, as the result records it."""
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.kind.name} ({opts})" if opts else self.kind.name


@dataclasses.dataclass(frozen=True)
class Guidance:
    """How a pipeline runs classifier-free guidance, read off one call of its tiny build on the CPU: the denoiser's
    calls in the first step, the batch of the first call, and the layout of its output."""

    calls_per_step: int
    batch: int
    layout: str | None  # "BCHW", "BCFHW", "BFCHW" (FasterCache's names), or None: another shape (a token sequence)

    @property
    def kind(self) -> str:
        if self.calls_per_step > 1:
            return "separate"  # one denoiser call per branch
        return "batched" if self.batch > 1 else "none"


def installed(package: str, install: str) -> Callable[[dict], str | None]:
    """A `host_check`: why not, when `package` cannot be imported here."""
    def check(options: dict) -> str | None:
        return None if importlib.util.find_spec(package) else f"{install} is not installed (`pip install {package}`)"
    return check

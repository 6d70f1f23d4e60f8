"""One run, described once: what is built and how it is called (`Run`), made from the command line or a campaign cell,
and everything else derived from it, so that no two places describe the same build differently:

- the build itself (`build`, `lab.run.scenario.build`), in this process or in a worker's (`message` is what a
  worker is sent, `from_message` what it makes of it);
- the size part of a result's name (`size_tag`: `full-4l-2steps-group_offload`);
- what a result records of its build (`header`), and what a run going on from a stored result must share with it
  (`identity`, held against the result by `lab.measure.cell.resume_problems`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from lab.base import naming
from lab.run.runner import CompileSpec


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run builds and how it calls it. `settings` are the `--setting` texts as given (parsed once, in
    `parsed`); `compile` how the denoiser is compiled; `diffusers` the version a run on another diffusers than the
    installed one names (`--diffusers`), which the result's name carries."""

    scenario: str
    size: str
    device: str
    dtype: str | None = None
    layers: int | None = None
    steps: int = naming.DEFAULT_STEPS
    call: str | None = None
    full_decode: bool = False
    checkpoint: str | None = None
    seed: int = 0
    settings: tuple[str, ...] = ()
    compile: CompileSpec = CompileSpec()
    diffusers: str | None = None

    @functools.cached_property
    def parsed(self) -> list:
        """The settings, parsed (`lab.run.settings.Setting`): refused here, before anything is built, if one is bad."""
        from lab.run import settings

        return settings.parse_all(list(self.settings))

    @property
    def described_settings(self) -> list[str]:
        """The settings as a result records them, with every option (`group_offload (level=block_level, ...)`)."""
        return [s.describe() for s in self.parsed]

    @property
    def build_kind(self) -> str:
        """Which build makes the pipelines: a real checkpoint's (`pretrained`), else the lab's faithful one."""
        from lab.run.scenario import BUILD

        return "pretrained" if self.size == "pretrained" else BUILD

    def size_tag(self) -> str:
        """The size part of a result's name (`lab.base.naming.size_tag`)."""
        from lab.run import settings

        return naming.size_tag(self.size, self.layers, self.call, self.steps, settings.tags(self.parsed),
                               self.diffusers, self.full_decode)

    def check(self) -> None:
        """Refuse, before anything is built, a setting this pipeline or device cannot take."""
        from lab.run import settings
        from lab.run.scenario import get_scenario, setting_target

        if self.parsed:
            scenario = get_scenario(self.scenario)
            settings.check(self.parsed, scenario.name, setting_target(scenario), self.device)

    def build(self, *, compiled: bool = True):
        """The pipeline as this run builds it (`lab.run.scenario.build`), compiled as `compile` says unless not
        `compiled`."""
        from lab.run.runner import apply_compile
        from lab.run.scenario import DTYPES, build, get_scenario

        built = build(get_scenario(self.scenario), size=self.size, device=self.device,
                      dtype=DTYPES[self.dtype] if self.dtype else None, layers=self.layers, steps=self.steps,
                      full_decode=self.full_decode, checkpoint=self.checkpoint, seed=self.seed, call=self.call,
                      settings=self.settings)
        if compiled:
            apply_compile(built, self.compile)
        return built

    def message(self) -> dict[str, Any]:
        """What a worker process is sent to build this run (JSON), `from_message`'s inverse."""
        out = dataclasses.asdict(self)
        out["settings"] = list(self.settings)
        return out

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Run:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in message.items() if k in fields}
        data["settings"] = tuple(data.get("settings") or ())
        data["compile"] = CompileSpec(**(data.get("compile") or {}))
        return cls(**data)

    def header(self) -> dict[str, Any]:
        """What a result records of its build: the size, depth, steps, mode and compile options, the settings with
        their options, whether each call decoded, and which build made the pipelines."""
        return {"size": self.size, "layers": self.layers, "steps": self.steps, "mode": self.compile.describe(),
                "compile": dataclasses.asdict(self.compile), "settings": self.described_settings,
                "decoded": self.full_decode, "build": self.build_kind}

    def identity(self) -> dict[str, Any]:
        """What a run going on from a stored result must share with it, of its build (`lab.measure.cell`)."""
        return {"scenario": self.scenario, "size": self.size, "layers": self.layers, "steps": self.steps,
                "mode": self.compile.describe(), "build": self.build_kind, "settings": self.described_settings}

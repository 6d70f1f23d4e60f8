"""A setting's life over a build: refused before it (`refusal`, `check`), turned on after it and undone (`apply`),
turned off and on again around a call (`without`), and its decisions from the data counted (`decisions`)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from lab.base.errors import UsageError
from lab.run.settings.catalog import REMADE_EXACTLY
from lab.run.settings.kind import Setting, Target, Undo


def refusal(setting: Setting, target: Target, device: str | None) -> str | None:
    """Why `setting` cannot run on this pipeline (`target`) and, unless `device` is None, on this device; None if it
    can. With `device=None` only what the pipeline decides is asked (a campaign file planned on another machine)."""
    if device is not None and setting.kind.accelerator_only and not device.startswith("cuda"):
        return setting.kind.accelerator_only
    why = setting.kind.check(target, setting.options) if setting.kind.check is not None else None
    if not why and device is not None and setting.kind.host_check is not None:
        why = setting.kind.host_check(setting.options)
    if not why and device is not None and setting.kind.device_check is not None:
        why = setting.kind.device_check(setting.options, device)
    return why


def check(settings: list[Setting], scenario: str, target: Target, device: str) -> None:
    """Refuse, before anything is built, a setting this pipeline (`target`, of scenario `scenario`) or this device
    cannot take."""
    pipeline_cls = target.pipeline_cls
    for s in settings:
        why = refusal(s, target, device)
        if why:
            raise UsageError(f"`--setting {s.name}` cannot run on `{scenario}` ({pipeline_cls.__name__}) "
                             f"on {device}: {why}.")


def apply(settings: list[Setting], built: Any) -> Undo:
    """Turn the settings on, in order; the returned function turns them off again in reverse order (hooks removed,
    adapters unloaded, weights and devices as before)."""
    undos: list[Undo] = []

    def undo() -> None:
        while undos:
            undos.pop()()

    try:
        for s in settings:
            try:
                undos.append(s.kind.apply(built, s.options))
            except UsageError as e:
                raise UsageError(f"`--setting {s.name}` cannot run on `{built.scenario.name}`: {e}.") from None
    except Exception:
        undo()
        raise
    return undo


#: the prefix of a decision's count among a verifying call's counts (`first_block_cache: skipped`)
DECIDED = "decided by "


@contextlib.contextmanager
def decisions(settings: list[Setting]) -> Iterator[dict[str, int]]:
    """Count the decisions of every setting in `settings` that makes them from the data (`Kind.decides`) while the
    block runs; the dict holds `decided by first_block_cache: computed` and `...: skipped` when it ends."""
    counted: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        deciding = [(s.name, stack.enter_context(s.kind.decides())) for s in settings if s.kind.decides]
        yield counted
        for name, counts in deciding:
            counted.update({f"{DECIDED}{name}: {what}": n for what, n in sorted(counts.items())})


def tags(settings: list[Setting]) -> tuple[str, ...]:
    return tuple(s.tag() for s in settings)


def without(settings: list[Setting], built: Any, call: Callable[[], Any]) -> Any:
    """`call()` with `settings` turned off, then on again as the build turned them on (`built.undo_settings` is the
    new undo): what the pipeline gives without them. Only cache hooks, whose hooks are made again the same
    (MagCache measures its ratios with calls, a LoRA's or quantization's weights would be made anew): None for any
    other setting, and None without settings."""
    if not settings or built.undo_settings is None or any(s.name not in REMADE_EXACTLY for s in settings):
        return None
    built.undo_settings()
    try:
        return call()
    finally:
        built.undo_settings = apply(settings, built)

"""The `--setting NAME[:OPTIONS]` grammar: a setting parsed from its text (`first_block_cache:threshold=0.2`,
`group_offload:leaf_level,stream`, `attention_backend:flex`, `lora:rank=16,fused`), each option checked against what
diffusers takes, and several settings checked to combine."""

from __future__ import annotations

import math
from typing import Any

from lab.base.errors import UsageError
from lab.run.settings.catalog import GROUP, SETTINGS
from lab.run.settings.kind import Kind, Range, Setting


def parse(text: str) -> Setting:
    """`NAME[:OPTIONS]`, OPTIONS comma-separated: `key=value`, a bool option's bare name, or a bare choice word."""
    name, _, rest = text.partition(":")
    kind = SETTINGS.get(name.strip())
    if kind is None:
        raise UsageError(f"Unknown setting `{name}`; choose one of {', '.join(SETTINGS)} (see `lab settings`).")
    options = dict(kind.options)
    given: dict[str, str] = {}  # option -> the item that set it: an option is given once

    def put(option: str, value: Any, item: str) -> None:
        if option in given:
            raise UsageError(f"`--setting {text}`: `{option}` is given twice (`{given[option]}`, `{item}`); give it "
                             "once.")
        given[option] = item
        options[option] = value

    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            chosen = [opt for opt, words in kind.choices.items() if key in words]
            if chosen:
                put(chosen[0], key, item)
                continue
            if isinstance(kind.options.get(key), bool):
                put(key, True, item)
                continue
            if kind.positional:
                put(kind.positional, _convert(text, kind, kind.positional, key), item)
                continue
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        if key not in kind.options:
            raise UsageError(f"`--setting {text}`: `{key}` is not an option of `{kind.name}` "
                             f"({_option_help(kind) or 'it takes none'}).")
        put(key, _convert(text, kind, key, value), item)
    return Setting(kind, options)


def _convert(text: str, kind: Kind, key: str, value: str) -> Any:
    """The option's value from its text, checked: one of its words, a bool, or a finite number in the range
    diffusers takes (`Kind.ranges`), so that nothing diffusers would refuse, or take and do nothing sensible with,
    reaches a build."""
    default, words = kind.options[key], kind.choices.get(key)
    if words is not None:
        if value not in words:
            raise UsageError(f"`--setting {text}`: `{key}` is one of {', '.join(words)}, not `{value}`.")
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            number: Any = int(value)
        elif isinstance(default, float):
            number = float(value)
        else:
            return value
    except ValueError:
        raise UsageError(f"`--setting {text}`: `{key}` takes a {type(default).__name__}, not `{value}`.") from None
    accepted = kind.ranges.get(key, Range())
    if not math.isfinite(number) or number not in accepted:
        why = f" ({accepted.why})" if accepted.why else ""
        raise UsageError(f"`--setting {text}`: `{key}` takes a finite {type(default).__name__} in {accepted}{why}, "
                         f"not `{value}`.")
    return number


def _option_help(kind: Kind) -> str:
    out = []
    for key, default in kind.options.items():
        words = kind.choices.get(key)
        out.append(f"{'|'.join(words)} (default {default})" if words else f"{key}={default}")
    return ", ".join(out)


def parse_all(texts: list[str] | None) -> list[Setting]:
    """The `--setting` options in order; one setting of each kind, and one cache and one offloading at most."""
    settings = [parse(t) for t in texts or ()]
    seen: dict[str, str] = {}
    for s in settings:
        group = GROUP.get(s.name, s.name)
        if group in seen:
            raise UsageError(f"`--setting {s.name}` and `--setting {seen[group]}` cannot be combined: diffusers takes "
                             f"one {group} at a time.")
        seen[group] = s.name
    return settings

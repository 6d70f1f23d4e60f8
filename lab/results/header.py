"""What every typed result is built on: the strict struct (an unknown field is an error, every field is given by
name) and the header each result file starts with (its format and kind, its name, when and by which command it was
made, and the scenario it measured)."""

from __future__ import annotations

import msgspec

#: the format of the result files written now (its history, and the upgrade of older files: `lab.results.schema`)
FORMAT_VERSION = 3


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A struct of a result file: fields by name only, and a field the struct does not know is an error."""


class ResultHeader(Strict, kw_only=True):
    """What every typed result starts with: its format and kind, its name, when and by which command it was made,
    and the scenario it measured."""

    format: int = FORMAT_VERSION
    kind: str = ""
    name: str
    created: str
    command: str
    scenario: str

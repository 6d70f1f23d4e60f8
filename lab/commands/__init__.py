"""The subcommands of `lab`: one module each, holding its parser and its handler.

A subcommand module defines

- `HELP`: the one-line help `lab --help` lists;
- `add_arguments(parser)`: its options (shared groups of options come from :mod:`lab.commands._options`);
- `run(args) -> int`: the handler, which returns the exit code and raises :class:`lab.base.errors.LabError` for bad input.

Adding a subcommand is adding a module here and its name to `ORDER` (the order `lab --help` shows them in: the
workflow, from the catalog to the tables).
"""

from __future__ import annotations

ORDER = ("fixes", "diff", "upstream", "scenarios", "settings", "run", "profile", "analyze", "ab", "history", "sweep", "calibrate", "scan", "hunt",
         "census", "table", "campaign")

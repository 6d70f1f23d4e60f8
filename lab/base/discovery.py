"""Finding the catalog entries (fixes, scenarios): one module per entry, each defining one named object."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from lab.base.errors import LabError

T = TypeVar("T")


def discover(package: ModuleType, attr: str, cls: type[T], name_of: Callable[[T], str]) -> list[tuple[str, T]]:
    """`(module name, object)` for every public module of `package`; a module without `attr` is an error."""
    found = []
    folder = package.__name__.rsplit(".", 1)[-1]
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        obj = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), attr, None)
        if not isinstance(obj, cls):
            raise LabError(f"`{folder}/{info.name}.py` defines no `{attr} = {cls.__name__}(...)`.")
        found.append((info.name, obj))
    return found

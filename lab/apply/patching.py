"""Exactly reversible attribute patches.

Every change the lab makes to diffusers goes through one :class:`Patcher`: it records the object each attribute
held (or that it had none of its own) and puts exactly that object back, in reverse order, when the patch is
removed, also when applying fails half-way or the code under the patch raises.
"""

from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

_MISSING = object()


class CallCounter:
    """Counts calls per label; used to prove that the code a fix changed actually ran."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def wrap(self, label: str, value: Any) -> Any:
        """A counting wrapper around a function, staticmethod or classmethod, keeping its signature."""
        if isinstance(value, (staticmethod, classmethod)):
            return type(value)(self.wrap(label, value.__func__))
        if not callable(value):
            return value

        @functools.wraps(value)
        def counted(*args, **kwargs):
            self.counts[label] += 1
            return value(*args, **kwargs)

        return counted


class Patcher:
    """Sets attributes and undoes them exactly.

    >>> patcher = Patcher()
    >>> patcher.setattr(SomeClass, "method", new_method)
    >>> patcher.restore()  # SomeClass.method is the original object again
    """

    def __init__(self, counter: CallCounter | None = None) -> None:
        self._undo: list[tuple[Any, str, Any] | Callable[[], None]] = []
        self.counter = counter

    def setattr(self, owner: Any, name: str, value: Any, *, count_as: str | None = None) -> None:
        """Set `owner.name = value`, remembering the owner's own previous value (or that it had none).

        With a call counter, a callable `value` is wrapped so calls are counted under `count_as`.
        """
        previous = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name, _MISSING)
        if count_as is not None and self.counter is not None:
            value = self.counter.wrap(count_as, value)
        setattr(owner, name, value)
        self._undo.append((owner, name, previous))

    def count(self, owner: Any, name: str, label: str) -> None:
        """Count calls to an existing attribute while patched (does nothing without a counter)."""
        if self.counter is not None:
            # On a class, take the raw attribute so a staticmethod stays a staticmethod.
            value = inspect.getattr_static(owner, name) if isinstance(owner, type) else getattr(owner, name)
            self.setattr(owner, name, value, count_as=label)

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run `undo` when the patches are undone, in its turn (newest first): a state change that is not an
        attribute (a runtime patch that pointed parameters at other tensors puts them back)."""
        self._undo.append(undo)

    def restore(self) -> None:
        """Undo every change, newest first, each even when an `on_restore` before it raised (that error is raised
        at the end). Safe to call twice."""
        failed: BaseException | None = None
        while self._undo:
            entry = self._undo.pop()
            if callable(entry):
                try:
                    entry()
                except BaseException as error:  # the attributes still go back; the first error after them
                    failed = failed or error
                continue
            owner, name, previous = entry
            if previous is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, previous)
        if failed is not None:
            raise failed

    def __enter__(self) -> "Patcher":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


# --- what a runtime patch of diffusers' hooks needs ---------------------------------------------------------------


def registered_hooks(pipe: Any, classes: type | tuple[type, ...]) -> Iterator[tuple[Any, Any]]:
    """Each diffusers hook of `classes` registered on a module of one of the pipeline's model components, with its
    module: what a setting registered at the build, before any fix was switched on."""
    for component in pipe.components.values():
        for module in component.modules() if hasattr(component, "modules") else ():
            registry = module.__dict__.get("_diffusers_hook")
            for hook in list(registry.hooks.values()) if registry is not None else ():
                if isinstance(hook, classes):
                    yield module, hook


def offloading_groups(pipe: Any) -> Iterator[tuple[Any, Any]]:
    """Each group that group offloading made on the pipeline's models, once (the modules of a group share it), with
    the hook of one of its modules (its `config` is the user's)."""
    from diffusers.hooks.group_offloading import GroupOffloadingHook

    seen = set()
    for _, hook in registered_hooks(pipe, GroupOffloadingHook):
        if id(hook.group) not in seen:
            seen.add(id(hook.group))
            yield hook, hook.group


def rebind_new_forward(patcher: Patcher, module: Any, hook: Any) -> None:
    """Point a registered hook's module at the hook's `new_forward` as its class has it now (a rewrite's): a hook
    binds the method when it is registered, so a hook registered before the rewrite would keep the old one."""
    bound = hook.new_forward
    patcher.setattr(hook.fn_ref, "forward", functools.update_wrapper(functools.partial(bound, module), bound))

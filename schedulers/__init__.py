"""The registry of scheduler adapters: every module of this package (but ``base``) declares
``ADAPTER``, a ``base.SchedulerAdapter`` subclass whose ``name`` is the module's own; a new
scheduler is a new module here (and its tests), and nothing else names it."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache

from schedulers.base import SchedulerAdapter

# A name is what a cluster stores (its ``scheduler`` column holds this many characters).
NAME_MAX_LENGTH = 16
NAME = re.compile(r"[a-z][a-z0-9_]*")

# Adapters registered at run time (a test's own), besides the package's modules.
_registered: dict[str, type[SchedulerAdapter]] = {}


def _checked(adapter: object, where: str) -> type[SchedulerAdapter]:
    if not (isinstance(adapter, type) and issubclass(adapter, SchedulerAdapter)):
        raise TypeError(f"{where} must be a SchedulerAdapter subclass, not {adapter!r}")
    name, label = getattr(adapter, "name", None), getattr(adapter, "label", None)
    if not (isinstance(name, str) and NAME.fullmatch(name) and len(name) <= NAME_MAX_LENGTH):
        raise TypeError(f"{where}.name must be a lowercase name of {NAME_MAX_LENGTH} or fewer")
    if not (isinstance(label, str) and label):
        raise TypeError(f"{where}.label must be a non-empty string")
    return adapter


@cache
def _modules() -> dict[str, type[SchedulerAdapter]]:
    found: dict[str, type[SchedulerAdapter]] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base":
            continue
        path = f"{__name__}.{module.name}"
        declared = getattr(importlib.import_module(path), "ADAPTER", None)
        adapter = _checked(declared, f"{path}.ADAPTER")
        if adapter.name != module.name:
            raise TypeError(f"{path}.ADAPTER.name must be {module.name!r}, its module's name")
        found[adapter.name] = adapter
    return found


def registry() -> dict[str, type[SchedulerAdapter]]:
    return dict(sorted({**_modules(), **_registered}.items()))


def register(adapter: type[SchedulerAdapter]) -> type[SchedulerAdapter]:
    """Add an adapter that is no module of this package (a test's); ``unregister`` removes it."""
    adapter = _checked(adapter, f"{adapter!r}")
    known = registry().get(adapter.name)
    if known is not None and known is not adapter:
        raise ValueError(f"scheduler {adapter.name!r} is already {known.__qualname__}")
    _registered[adapter.name] = adapter
    return adapter


def unregister(name: str) -> None:
    if name not in _registered:
        raise KeyError(f"scheduler {name!r} was not registered (a module's cannot be removed)")
    del _registered[name]


def names() -> list[str]:
    return list(registry())


def choices() -> list[tuple[str, str]]:
    """For the model field and forms: (name, label) of each scheduler."""
    return [(adapter.name, adapter.label) for adapter in registry().values()]


def adapter_class(name: str) -> type[SchedulerAdapter]:
    adapter = _registered.get(name) or _modules().get(name)
    if adapter is None:
        raise ValueError(f"unknown scheduler {name!r}")
    return adapter

"""The registry of session kinds: every module of this package (but ``base``) defines ``KIND``,
an instance of ``base.SessionKind``; a new kind is a new module here and a node starter in
``node/starters/``, and nothing else names it."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from sessions_app.kinds.base import SessionKind


class UnknownKind(KeyError):
    pass


@cache
def registry() -> dict[str, SessionKind]:
    found: dict[str, SessionKind] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base":
            continue
        kind = importlib.import_module(f"{__name__}.{module.name}").KIND
        if not isinstance(kind, SessionKind) or kind.name != module.name:
            raise TypeError(f"{__name__}.{module.name}.KIND must be a SessionKind named so")
        found[kind.name] = kind
    return dict(sorted(found.items()))


def all_kinds() -> list[SessionKind]:
    return list(registry().values())


def names() -> list[str]:
    return list(registry())


def choices() -> list[tuple[str, str]]:
    """For the model field and forms: (name, label) of each kind."""
    return [(kind.name, kind.label) for kind in all_kinds()]


def get(name: str) -> SessionKind:
    try:
        return registry()[name]
    except KeyError:
        raise UnknownKind(name) from None

"""The registry of session kinds: the built-in ones, each a module of this package (but
``base`` and ``operator``) defining ``KIND``, an instance of ``base.SessionKind`` with a node
starter in ``node/starters/``; and the apps operators define (``sessions_app.catalog``), read
from the database each time they are asked for, as ``operator.OperatorApp``. Nothing else
names a kind."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from sessions_app.catalog import store
from sessions_app.kinds.base import SessionKind
from sessions_app.kinds.operator import OperatorApp

NOT_KINDS = ("base", "operator")


class UnknownKind(KeyError):
    pass


@cache
def builtin() -> dict[str, SessionKind]:
    found: dict[str, SessionKind] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name in NOT_KINDS:
            continue
        kind = importlib.import_module(f"{__name__}.{module.name}").KIND
        if not isinstance(kind, SessionKind) or kind.name != module.name:
            raise TypeError(f"{__name__}.{module.name}.KIND must be a SessionKind named so")
        found[kind.name] = kind
    return dict(sorted(found.items()))


def builtin_names() -> list[str]:
    return list(builtin())


def registry() -> dict[str, SessionKind]:
    """Every kind people may launch: the built-in ones first, then the enabled apps."""
    apps = {spec.name: OperatorApp(spec) for spec in store.enabled_specs()}
    return {**builtin(), **{name: apps[name] for name in sorted(apps) if name not in builtin()}}


def all_kinds() -> list[SessionKind]:
    return list(registry().values())


def seen_by(user: AbstractBaseUser | AnonymousUser) -> list[SessionKind]:
    """The kinds ``user`` may launch (an app may be limited to some groups)."""
    return [kind for kind in all_kinds() if kind.seen_by(user)]


def names() -> list[str]:
    return list(registry())


def choices() -> list[tuple[str, str]]:
    """For the model field and forms: (name, label) of each kind (read when asked: a new app
    needs no migration)."""
    built = [(kind.name, kind.label) for kind in builtin().values()]
    return built + sorted(app for app in store.enabled_names() if app[0] not in builtin())


def get(name: str) -> SessionKind:
    """The kind named ``name``: a built-in one, or an app, enabled or not (a session of an app
    an operator has since disabled keeps running)."""
    found = builtin().get(name)
    if found is not None:
        return found
    spec = store.spec_named(name)
    if spec is None:
        raise UnknownKind(name)
    return OperatorApp(spec)

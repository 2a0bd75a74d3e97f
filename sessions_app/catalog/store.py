"""The catalogue's rows read and written: apps as specs, saved by name, and who may launch
which app where (the app's own limits on top of what the user sees of clusters and
environments)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, Group
from django.db import DatabaseError, transaction
from django.db.models import Prefetch, QuerySet
from django.db.models.signals import m2m_changed, post_delete, post_save

from sessions_app.catalog.models import App, AppField
from sessions_app.catalog.spec import AppSpec, from_model
from workers_app.models import Cluster, Environment
from workers_app.models.clusters import may_see_all, user_groups


class UnknownNames(ValueError):
    """An app names clusters, environments or groups this platform lacks."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path[0]}[{path[1]}]: {msg}" for path, msg in problems))


def _apps() -> QuerySet[App]:
    return App.objects.prefetch_related(
        Prefetch("fields", queryset=AppField.objects.order_by("position", "id")),
        "clusters",
        Prefetch("environments", queryset=Environment.objects.select_related("cluster")),
        "groups",
    )


def enabled_specs() -> list[AppSpec]:
    return [from_model(app) for app in _apps().filter(enabled=True)]


def enabled_names() -> list[tuple[str, str]]:
    """(name, label) of the enabled apps; none while the table is not there yet (the system
    checks read the sessions' choices before the first migration)."""
    try:
        with transaction.atomic():
            return list(App.objects.filter(enabled=True).values_list("name", "label"))
    except DatabaseError:
        return []


# The proxy asks for a session's kind with every request it carries: an app read in the last
# seconds is not read again (five queries) in this process; a change saved here is seen at once,
# one saved by another process within SPEC_FRESH_FOR.
SPEC_FRESH_FOR = 2.0
_recent: dict[str, tuple[float, AppSpec]] = {}


def spec_named(name: str) -> AppSpec | None:
    """The app named ``name``, enabled or not (a session of a disabled app keeps running)."""
    kept = _recent.get(name)
    if kept is not None and time.monotonic() - kept[0] < SPEC_FRESH_FOR:
        return kept[1]
    app = _apps().filter(name=name).first()
    if app is None:
        return None
    spec = from_model(app)
    _recent[name] = (time.monotonic(), spec)
    return spec


def forget_recent(**_signal: object) -> None:
    _recent.clear()


for _model in (App, AppField):
    post_save.connect(forget_recent, sender=_model, dispatch_uid=f"catalog-{_model.__name__}-save")
    post_delete.connect(
        forget_recent, sender=_model, dispatch_uid=f"catalog-{_model.__name__}-delete"
    )
for _through in (App.clusters.through, App.environments.through, App.groups.through):
    m2m_changed.connect(forget_recent, sender=_through, dispatch_uid=f"catalog-{_through.__name__}")


def all_specs(names: Iterable[str] = ()) -> list[AppSpec]:
    wanted = list(names)
    apps = _apps().filter(name__in=wanted) if wanted else _apps()
    return [from_model(app) for app in apps.order_by("name")]


def save(spec: AppSpec) -> App:
    """Create or update the app named ``spec.name`` to be exactly ``spec`` (its fields and
    limits replaced); the caller has checked it (``rules``) and holds a transaction."""
    clusters = {c.name: c for c in Cluster.objects.filter(name__in=spec.clusters)}
    groups = {g.name: g for g in Group.objects.filter(name__in=spec.groups)}
    environments = {
        f"{e.cluster.name}/{e.name}": e
        for e in Environment.objects.select_related("cluster").filter(
            cluster__name__in=[text.partition("/")[0] for text in spec.environments]
        )
    }
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for key, wanted, found, what in (
        ("clusters", spec.clusters, clusters, "cluster"),
        ("environments", spec.environments, environments, "environment"),
        ("groups", spec.groups, groups, "group"),
    ):
        for index, name in enumerate(wanted):
            if name not in found:
                problems.append(((key, index), f"no {what} named {name!r} here"))
    if problems:
        raise UnknownNames(problems)
    app, _ = App.objects.update_or_create(
        name=spec.name,
        defaults={
            "label": spec.label,
            "description": spec.description,
            "icon": spec.icon,
            "command": list(spec.command),
            "env": dict(spec.env),
            "reach": spec.reach,
            "keeps_prefix": spec.keeps_prefix,
            "ready_path": spec.ready_path,
            "ready_statuses": list(spec.ready_statuses),
            "start_timeout": spec.start_timeout,
            "login": dict(spec.login),
            "landing_path": spec.landing_path,
            "enabled": spec.enabled,
        },
    )
    app.fields.all().delete()
    AppField.objects.bulk_create(
        AppField(
            app=app,
            name=item.name,
            label=item.label,
            default=item.default,
            pattern=item.pattern,
            required=item.required,
            choices=list(item.choices),
            position=position,
        )
        for position, item in enumerate(spec.fields)
    )
    app.clusters.set([clusters[name] for name in spec.clusters])
    app.environments.set([environments[name] for name in spec.environments])
    app.groups.set([groups[name] for name in spec.groups])
    return app


def seen_by(spec: AppSpec, user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether ``user`` sees the app at all: it is enabled and names none of the user's groups
    or one of them (operators see every app, as they see every cluster)."""
    if not spec.enabled:
        return False
    if not spec.groups or may_see_all(user):
        return True
    return user_groups(user).filter(name__in=spec.groups).exists()


def offered_on(spec: AppSpec, cluster: str, environment: str | None) -> bool:
    """Whether the app runs on this cluster and environment (None: a worker from none)."""
    if spec.clusters and cluster not in spec.clusters:
        return False
    if spec.environments and f"{cluster}/{environment}" not in spec.environments:
        return False
    return True

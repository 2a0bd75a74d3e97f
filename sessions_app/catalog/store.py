"""The catalogue's rows read and written: apps as specs, saved by name, and who may launch
which app where (the app's own limits on top of what the user sees of clusters and
environments)."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, Group
from django.db import DatabaseError, transaction
from django.db.models import Prefetch, QuerySet

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


def spec_named(name: str) -> AppSpec | None:
    """The app named ``name``, enabled or not (a session of a disabled app keeps running)."""
    app = _apps().filter(name=name).first()
    return from_model(app) if app is not None else None


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

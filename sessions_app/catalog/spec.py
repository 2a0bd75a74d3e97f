"""An operator's app as plain data: what the YAML files hold, what the registry's kind reads,
and what the node's starter is told (the part of it the node needs)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from sessions_app.catalog.models import App

# What the node's starter fills into the command and environment, besides the fields' values.
NODE_PLACEHOLDERS = (
    "socket",
    "port",
    "base_url",
    "base_path",
    "home",
    "cwd",
    "workdir",
    "secret_file",
)
# The program's password: only where nobody else can read it (its environment, the login).
SECRET = "secret"  # noqa: S105 - the placeholder's name, not a password


@dataclass(frozen=True)
class FieldSpec:
    name: str
    label: str = ""
    default: str = ""
    pattern: str = ""
    required: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class AppSpec:
    name: str
    label: str
    command: tuple[str, ...]
    description: str = ""
    icon: str = ""
    env: dict[str, str] = field(default_factory=dict)
    reach: str = "unix"
    keeps_prefix: bool = False
    ready_path: str = ""
    ready_statuses: tuple[int, ...] = (200,)
    start_timeout: int = 90
    login: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    landing_path: str = ""
    fields: tuple[FieldSpec, ...] = ()
    clusters: tuple[str, ...] = ()
    # "cluster/environment"
    environments: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    enabled: bool = True

    def field_named(self, name: str) -> FieldSpec | None:
        return next((f for f in self.fields if f.name == name), None)


def to_data(spec: AppSpec) -> dict[str, Any]:
    """The YAML file's shape, its keys in a fixed order (an export reads the same each time)."""
    data: dict[str, Any] = {
        "name": spec.name,
        "label": spec.label,
        "description": spec.description,
        "icon": spec.icon,
        "command": list(spec.command),
        "env": dict(spec.env),
        "reach": spec.reach,
        "keeps_prefix": spec.keeps_prefix,
        "ready": {
            "path": spec.ready_path,
            "statuses": list(spec.ready_statuses),
            "timeout": spec.start_timeout,
        },
        "login": dict(spec.login),
        "landing_path": spec.landing_path,
        "fields": [
            {
                "name": f.name,
                "label": f.label,
                "default": f.default,
                "pattern": f.pattern,
                "required": f.required,
                "choices": list(f.choices),
            }
            for f in spec.fields
        ],
        "clusters": list(spec.clusters),
        "environments": list(spec.environments),
        "groups": list(spec.groups),
    }
    if not spec.enabled:
        data["enabled"] = False
    return data


def from_model(app: App) -> AppSpec:
    return AppSpec(
        name=app.name,
        label=app.label,
        description=app.description,
        icon=app.icon,
        command=tuple(app.command),
        env=dict(app.env),
        reach=app.reach,
        keeps_prefix=app.keeps_prefix,
        ready_path=app.ready_path,
        ready_statuses=tuple(app.ready_statuses),
        start_timeout=app.start_timeout,
        login=dict(app.login),
        landing_path=app.landing_path,
        fields=tuple(
            FieldSpec(
                name=f.name,
                label=f.label,
                default=f.default,
                pattern=f.pattern,
                required=f.required,
                choices=tuple(f.choices),
            )
            for f in app.fields.all()
        ),
        clusters=tuple(sorted(c.name for c in app.clusters.all())),
        environments=tuple(sorted(f"{e.cluster.name}/{e.name}" for e in app.environments.all())),
        groups=tuple(sorted(g.name for g in app.groups.all())),
        enabled=app.enabled,
    )


def node_spec(spec: AppSpec, *, values: dict[str, str], base_url: str) -> str:
    """What the node's starter is told in ``--spec-b64``: URL-safe base64 of JSON, so the one
    argument holds nothing a shell would read, whatever the values hold."""
    told = {
        "name": spec.name,
        "command": list(spec.command),
        "env": dict(spec.env),
        "reach": spec.reach,
        "values": dict(values),
        "base_url": base_url,
        "start_timeout": spec.start_timeout,
    }
    text = json.dumps(told, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def read_node_spec(argument: str) -> dict[str, Any]:
    """The inverse of ``node_spec`` (the node's starter does the same)."""
    told: dict[str, Any] = json.loads(base64.urlsafe_b64decode(argument.encode("ascii")))
    return told

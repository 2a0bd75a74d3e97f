"""The data model, one module per area; everything is importable from here as Django expects."""

from __future__ import annotations

from workers_app.models.api_keys import ApiKey, KeyScope
from workers_app.models.clusters import (
    AccountOrigin,
    AgentRelay,
    AgentRoute,
    Cluster,
    ClusterAccount,
    Reachability,
    RelayState,
    UnixNameRule,
)
from workers_app.models.environments import (
    Environment,
    EnvironmentField,
    EnvironmentSource,
    FieldKind,
)
from workers_app.models.identity import (
    PUBLIC_ID_ALPHABET,
    generate_public_id,
    hash_secret,
    job_name_for,
    job_name_prefix,
    new_agent_secret,
)
from workers_app.models.saved import SavedRequest
from workers_app.models.terminals import TerminalRecord
from workers_app.models.usage import UsageCap
from workers_app.models.workers import Worker, WorkerCommand, WorkerEvent, WorkerQuerySet

__all__ = [
    "PUBLIC_ID_ALPHABET",
    "AccountOrigin",
    "AgentRelay",
    "AgentRoute",
    "ApiKey",
    "Cluster",
    "ClusterAccount",
    "Environment",
    "EnvironmentField",
    "EnvironmentSource",
    "FieldKind",
    "KeyScope",
    "Reachability",
    "RelayState",
    "SavedRequest",
    "TerminalRecord",
    "UnixNameRule",
    "UsageCap",
    "Worker",
    "WorkerCommand",
    "WorkerEvent",
    "WorkerQuerySet",
    "generate_public_id",
    "hash_secret",
    "job_name_for",
    "job_name_prefix",
    "new_agent_secret",
]

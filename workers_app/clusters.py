"""The cluster catalogue: whether a cluster answers, and the environments its partitions make."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from workers_app import lifecycle
from workers_app.connections import KeyUnusable, adapter_for
from workers_app.models import (
    Cluster,
    Environment,
    EnvironmentField,
    EnvironmentSource,
    Reachability,
)
from workers_app.schedulers.base import FieldTemplate, QueryFailed, SchedulerError
from workers_app.transport.ssh import SSHError


def note_cluster_contact(cluster: Cluster, *, error: Exception | None = None) -> None:
    """What the last contact said, for operators: online, offline, or misconfigured (a stored
    key the platform cannot decrypt, which no retry mends)."""
    now = timezone.now()
    if error is not None:
        reachability = (
            Reachability.MISCONFIGURED if isinstance(error, KeyUnusable) else Reachability.OFFLINE
        )
        Cluster.objects.filter(pk=cluster.pk).update(
            reachability=reachability, last_error=str(error)[:2000]
        )
        return
    was_offline = cluster.reachability != Reachability.ONLINE
    Cluster.objects.filter(pk=cluster.pk).update(
        reachability=Reachability.ONLINE, last_contact_at=now, last_error=""
    )
    if was_offline:
        # The cluster answers again: send what waited for it now, not at the next backoff.
        lifecycle.attempt_pending_now(cluster.pk, now=now)


def probe_cluster(cluster_id: int) -> bool:
    """Check reachability and refresh auto-detected environments, as the cluster's own account.

    A cluster without an account of its own is not probed: its environments are custom ones.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    if not cluster.username or not cluster.has_private_key:
        return False
    try:
        adapter = adapter_for(cluster)
        partitions = adapter.partitions()
    except (SSHError, QueryFailed, SchedulerError) as exc:
        note_cluster_contact(cluster, error=exc)
        return False
    note_cluster_contact(cluster)
    now = timezone.now()
    templates = adapter.default_fields()
    for partition in partitions:
        with transaction.atomic():
            environment, created = Environment.objects.get_or_create(
                cluster=cluster,
                name=partition.name,
                defaults={"partition": partition.name, "source": EnvironmentSource.AUTO},
            )
            if environment.source != EnvironmentSource.AUTO:
                continue
            environment.nodes_total = partition.nodes_total
            environment.nodes_available = partition.nodes_available
            environment.nodes_updated_at = now
            environment.save(update_fields=["nodes_total", "nodes_available", "nodes_updated_at"])
            if created:
                create_fields(environment, templates)
    return True


def create_fields(environment: Environment, templates: list[FieldTemplate]) -> None:
    EnvironmentField.objects.bulk_create(
        EnvironmentField(
            environment=environment,
            name=template.name,
            label=template.label,
            kind=template.kind,
            default=template.default,
            pattern=template.pattern,
            example=template.example,
            required=template.required,
            directive=template.directive,
            position=position,
        )
        for position, template in enumerate(templates)
    )

"""The cluster catalogue: registering a cluster, whether it answers, the environments its
partitions make, and the platform as its SSH certificate authority."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.transport.errors import SSHError
from core.transport.hostkeys import fingerprint
from identity import certificates
from schedulers.base import FieldTemplate, QueryFailed, SchedulerError
from workers_app import effects
from workers_app.actions import lifecycle
from workers_app.cluster_access import KeyUnusable, adapter_for
from workers_app.models import (
    AgentRoute,
    Cluster,
    Environment,
    EnvironmentField,
    EnvironmentSource,
    Reachability,
)


@dataclass(frozen=True)
class ClusterRegistration:
    """What an operator says about a cluster, in the admin or with `add_cluster`."""

    name: str
    host: str
    scheduler: str
    port: int = 22
    # Pinned as given ("ssh-ed25519 AAAA..."); empty: not pinned yet, so never connected to.
    host_key: str = ""
    # The cluster's own account: a user and its private key, both or neither.
    username: str = ""
    # None keeps the stored key (while there is a user); "" means the cluster has none.
    private_key: str | None = None
    shared: bool = False
    agent_route: str = AgentRoute.DIRECT
    relay_host: str = ""
    relay_port: int = 0


@dataclass(frozen=True)
class Registered:
    cluster: Cluster
    # Whether the cluster answered the probe made at once; None when none was (no account of
    # its own, or the probe was queued).
    answered: bool | None


def registration_errors(
    registration: ClusterRegistration, *, cluster: Cluster | None = None
) -> dict[str, list[str]]:
    """What is wrong with ``registration`` beyond each field's own checks, by field name.

    ``cluster`` is the stored one it changes, if any.
    """
    errors: dict[str, list[str]] = {}
    reg = registration
    if reg.host_key.strip():
        try:
            fingerprint(reg.host_key.strip())
        except ValueError as exc:
            errors["host_key"] = [f"Not a usable host key: {exc}"]
    pem = (reg.private_key or "").strip()
    if pem and "PRIVATE KEY" not in pem:
        errors["private_key"] = ["This does not look like a private key."]
    if pem and not reg.username:
        errors["username"] = ["A private key needs the user it logs in as."]
    has_key = bool(pem) or (
        reg.private_key is None and cluster is not None and cluster.has_private_key
    )
    if reg.username and not has_key:
        errors["private_key"] = ["The cluster's own account needs its private key."]
    if reg.shared and not (reg.username and has_key):
        errors["shared"] = [
            "A shared cluster needs its own account (a user and its private key): every user "
            "acts as that account."
        ]
    return errors


def register_cluster(
    registration: ClusterRegistration, *, cluster: Cluster | None = None, probe_now: bool = False
) -> Registered:
    """Save a new cluster, or ``cluster`` changed as ``registration`` says: its host key pinned,
    its own account's private key stored encrypted. A cluster with an account of its own is
    probed for its partitions (they become environments): at once with ``probe_now``, else by
    a task queued when the change commits.

    Raises ValidationError naming each wrong field; nothing is saved then.
    """
    errors = registration_errors(registration, cluster=cluster)
    if errors:
        raise ValidationError(errors)
    reg = registration
    cluster = cluster or Cluster()
    cluster.name, cluster.host, cluster.port = reg.name, reg.host, reg.port
    cluster.scheduler, cluster.host_key = reg.scheduler, reg.host_key.strip()
    cluster.username, cluster.shared = reg.username, reg.shared
    cluster.agent_route = reg.agent_route
    cluster.relay_host, cluster.relay_port = reg.relay_host, reg.relay_port
    pem = (reg.private_key or "").strip()
    if pem:
        cluster.set_private_key(pem + "\n")
    elif not reg.username:
        cluster.private_key_encrypted = ""
    cluster.full_clean()
    with transaction.atomic():
        cluster.save()
        if cluster.has_private_key and not probe_now:
            effects.probe_cluster(cluster.pk)
    if cluster.has_private_key and probe_now:
        return Registered(cluster, probe_cluster(cluster.pk))
    return Registered(cluster, None)


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


def make_cluster_authority(cluster: Cluster, *, rotate: bool = False) -> str:
    """Make the platform ``cluster``'s SSH certificate authority (a new key with ``rotate``, else
    the one it has); returns the CA's public line for the login hosts' TrustedUserCAKeys.

    A rotated CA signs every new login at once: the login hosts need its line first (keep the
    old one there until the connections it let in have closed)."""
    if cluster.ca_public_key and not rotate:
        return cluster.ca_public_key
    authority = certificates.new_authority(certificates.authority_comment(cluster.name))
    cluster.ca_private_key_encrypted = authority.private_key_encrypted
    cluster.ca_public_key = authority.public_key
    cluster.save(update_fields=["ca_private_key_encrypted", "ca_public_key"])
    return cluster.ca_public_key


def remove_cluster_authority(cluster: Cluster) -> None:
    """The platform signs no more certificates for ``cluster``: accounts without a key of their
    own cannot log in there until an operator or the user gives them one."""
    cluster.ca_private_key_encrypted = cluster.ca_public_key = ""
    cluster.save(update_fields=["ca_private_key_encrypted", "ca_public_key"])

"""What job scripts of a cluster tell their agents to call, and what names and places a relay."""

from __future__ import annotations

import hashlib

from django.conf import settings

from schedulers.base import SchedulerUnavailable
from workers_app.models import AgentRelay, AgentRoute, Cluster


class RelayNotReady(SchedulerUnavailable):
    """The cluster's agents go via its login host, and its relay has never been up yet: the
    submission waits and is retried, like one the scheduler did not answer."""


def relay_tag(cluster: Cluster) -> str:
    """Names the relay on the login host: one per cluster and installation."""
    return f"{settings.ACTIVATE_INSTALLATION_ID}-{cluster.pk}"


def agent_url_for(cluster: Cluster) -> str:
    """What a job script on ``cluster`` tells its agent to call."""
    if cluster.agent_route != AgentRoute.VIA_LOGIN_HOST:
        return settings.ACTIVATE_AGENT_URL
    address = (
        AgentRelay.objects.filter(cluster=cluster).values_list("address", flat=True).first() or ""
    )
    if not address:
        raise RelayNotReady(f"the relay on the login host of {cluster.name} has not started yet")
    return f"http://{address}"


def upstream_address() -> tuple[str, int]:
    host, _, port = settings.ACTIVATE_RELAY_UPSTREAM.rpartition(":")
    return host.strip("[]"), int(port)


def relay_fingerprint(cluster: Cluster) -> str:
    """Anything that changes where or how the relay runs makes a new one."""
    parts = (
        cluster.host,
        cluster.port,
        cluster.username,
        cluster.private_key_encrypted,
        cluster.host_key,
        cluster.relay_host,
        cluster.relay_port,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()

"""The AgentRelay rows: what keepers note of their relay, and what operators, the API and the
heartbeat sweep read from them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from workers_app.models import AgentRelay, AgentRoute, Cluster, RelayState


@dataclass(frozen=True)
class Holding:
    """A keeper's holding of a cluster's relay lease: whose, and the lease's number for it."""

    holder: str
    number: int


def note(cluster_id: int, holding: Holding, **fields: object) -> bool:
    """Write what a keeper saw, if the row is still its holding's: False (nothing written) once
    a later holding took it, so a keeper paused past its lease and continued writes nothing
    over its successor's."""
    mine = AgentRelay.objects.filter(
        cluster_id=cluster_id, holder=holding.holder, fence=holding.number
    )
    return mine.update(**fields) == 1


def note_started(cluster_id: int, holding: Holding) -> str:
    """A supervisor took the cluster's lease: the row is its holding's from now on (taken even
    from a higher number, since the lease, not the row, says who holds it: Redis may have lost
    the counter). Returns the state the previous one left."""
    relay, _ = AgentRelay.objects.get_or_create(cluster_id=cluster_id)
    AgentRelay.objects.filter(pk=relay.pk).update(
        state=RelayState.STARTING,
        holder=holding.holder,
        fence=holding.number,
        checked_at=timezone.now(),
        updated_at=timezone.now(),
    )
    return relay.state


def note_shedding(cluster_id: int, holding: Holding, *, report: str, now: datetime) -> bool:
    """The relay could not pass some calls (it made connections give way, refused them for want
    of slots, or could not reach the platform): they may have been agents' beats, so it counts
    as up, for the heartbeat sweep, only from now on, as after a repair."""
    return note(
        cluster_id,
        holding,
        up_since=now,
        last_error=f"the relay shed calls, so no agent's silence counts meanwhile: {report}"[:2000],
        checked_at=now,
        updated_at=now,
    )


def stop_unwanted_relays() -> int:
    """Relays of clusters switched back to direct that no supervisor confirms any more."""
    stale = timezone.now() - timedelta(seconds=settings.ACTIVATE_RELAY_LEASE)
    return (
        AgentRelay.objects.filter(cluster__agent_route=AgentRoute.DIRECT)
        .exclude(state=RelayState.STOPPED)
        .filter(Q(checked_at__lt=stale) | Q(checked_at__isnull=True))
        .update(state=RelayState.STOPPED, forwarded_port=None, updated_at=timezone.now())
    )


def clusters_agents_cannot_reach(now: datetime) -> set[int]:
    """Via-login-host clusters whose relay has not been up, passing every call, for a whole
    heartbeat timeout (down, shedding calls lately, or no supervisor confirms it): their
    agents' silence may be the relay's, not theirs."""
    stale = now - timedelta(seconds=settings.ACTIVATE_RELAY_LEASE)
    heard_since = now - timedelta(seconds=settings.ACTIVATE_HEARTBEAT_TIMEOUT)
    heard = AgentRelay.objects.filter(
        state=RelayState.UP, up_since__lte=heard_since, checked_at__gte=stale
    ).values("cluster_id")
    return set(
        Cluster.objects.filter(agent_route=AgentRoute.VIA_LOGIN_HOST)
        .exclude(pk__in=heard)
        .values_list("pk", flat=True)
    )

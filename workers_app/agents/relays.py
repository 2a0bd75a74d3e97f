"""Relays on login hosts: how agents reach the platform on clusters whose compute nodes cannot.

A cluster in via-login-host mode gets a relay on its login host (``transport/tunnel.py``) that
`run_relays` (``scripts/start.sh relays``) keeps: a keeper thread per cluster holds a Redis lease
(one relay per cluster and installation, whatever the number of run_relays processes), checks the
SSH connection and the relay process, and sets both up again when either is lost. Job scripts
of such a cluster give agents the relay's address, which stays the same across repairs. What
each keeper sees is written to the cluster's AgentRelay row, for the admin, the API and `pw`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import F, Q
from django.utils import timezone

from workers_app.connections import new_connection
from workers_app.models import AgentRelay, AgentRoute, Cluster, RelayState, Worker
from workers_app.node import relay_source
from workers_app.redis_connection import redis_client
from workers_app.schedulers.base import SchedulerUnavailable
from workers_app.statuses import WorkerStatus
from workers_app.transport.errors import SSHError
from workers_app.transport.tunnel import RelayTunnel

log = logging.getLogger(__name__)
LEASE_KEY = "activate:relay-lease:"
# How often a keeper looks for a dead relay or connection between its full checks.
TROUBLE_POLL = 0.1


class RelayNotReady(SchedulerUnavailable):
    """The cluster's agents go via its login host, and its relay has never been up yet: the
    submission waits and is retried, like one the scheduler did not answer."""


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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


# -- the lease ----------------------------------------------------------------------------------

# Renew our own lease, or take it again if it lapsed and nobody else took it meanwhile.
_RENEW = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """One holder per cluster and installation. Held until its time runs out by our own clock,
    so a holder that cannot reach Redis lets go before anyone else may take it."""

    def __init__(self, cluster_id: int) -> None:
        self.key = f"{LEASE_KEY}{settings.ACTIVATE_INSTALLATION_ID}:{cluster_id}"
        self.token = f"{holder_name()}:{uuid.uuid4().hex}"
        self.until = 0.0

    def _ttl_ms(self) -> int:
        return max(1, int(settings.ACTIVATE_RELAY_LEASE * 1000))

    def take(self) -> bool:
        started = time.monotonic()
        try:
            taken = bool(redis_client().set(self.key, self.token, nx=True, px=self._ttl_ms()))
        except redis.RedisError as exc:
            log.warning("relay lease %s: %s", self.key, exc)
            return False
        if taken:
            self.until = started + settings.ACTIVATE_RELAY_LEASE
        return taken

    def renew(self) -> bool:
        """Whether we still hold it."""
        started = time.monotonic()
        try:
            kept = bool(redis_client().eval(_RENEW, 1, self.key, self.token, self._ttl_ms()))
        except redis.RedisError as exc:
            log.warning("relay lease %s not renewed: %s", self.key, exc)
            return self.held()
        self.until = started + settings.ACTIVATE_RELAY_LEASE if kept else 0.0
        return kept

    def held(self) -> bool:
        return time.monotonic() < self.until

    def release(self) -> None:
        self.until = 0.0
        try:
            redis_client().eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            pass  # it lapses on its own


# -- what operators see -------------------------------------------------------------------------


def _note(cluster_id: int, **fields: object) -> None:
    AgentRelay.objects.filter(cluster_id=cluster_id).update(**fields)


def note_started(cluster_id: int, holder: str) -> str:
    """A supervisor took the cluster's lease; returns the state the previous one left."""
    relay, _ = AgentRelay.objects.get_or_create(cluster_id=cluster_id)
    AgentRelay.objects.filter(pk=relay.pk).update(
        state=RelayState.STARTING,
        holder=holder,
        checked_at=timezone.now(),
        updated_at=timezone.now(),
    )
    return relay.state


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
    """Via-login-host clusters whose relay has not been up for a whole heartbeat timeout (or no
    supervisor confirms it): their agents' silence may be the relay's, not theirs."""
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


# -- keeping one relay --------------------------------------------------------------------------


def tunnel_for(cluster: Cluster, address: str) -> RelayTunnel:
    """A relay over a connection of its own, as the cluster's own account."""
    kept_port = int(address.rpartition(":")[2]) if address else 0
    return RelayTunnel(
        new_connection(cluster, max_channels=1),
        upstream=upstream_address(),
        # Relayed requests name the agents' server as job scripts of direct clusters do, so the
        # platform's allowed hosts need no login host's name.
        upstream_host=urlsplit(settings.ACTIVATE_AGENT_URL).netloc,
        source=relay_source(),
        tag=relay_tag(cluster),
        bind_host=cluster.relay_host,
        bind_port=cluster.relay_port or kept_port,
        timeout=settings.ACTIVATE_SSH_CONNECT_TIMEOUT,
    )


class RelayKeeper:
    """Keeps one cluster's relay up while it holds the cluster's lease (a thread of its own, so
    an unreachable login host never delays another cluster's repair)."""

    def __init__(self, cluster: Cluster, lease: Lease, *, holder: str) -> None:
        self.cluster = cluster
        self.cluster_id = cluster.pk
        self.fingerprint = relay_fingerprint(cluster)
        self.lease = lease
        self.holder = holder
        self.tunnel: RelayTunnel | None = None
        self.was_up = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"relay-keeper-{cluster.name}", daemon=True
        )

    def start(self) -> None:
        # Taken over from a supervisor that had it running: setting it up again is a repair.
        self.was_up = note_started(self.cluster_id, self.holder) in (RelayState.UP, RelayState.DOWN)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, state: str, why: str) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=settings.ACTIVATE_SSH_CONNECT_TIMEOUT * 3)
        self._close()
        # A keeper that lost its lease says nothing more: the row is its successor's now.
        if self.lease.held():
            _note(
                self.cluster_id,
                state=state,
                last_error=why,
                forwarded_port=None,
                updated_at=timezone.now(),
            )
            log.info("relay of %s %s: %s", self.cluster.name, state, why)
        self.lease.release()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                close_old_connections()
                try:
                    if not self.step():
                        break
                except DatabaseError as exc:
                    # What operators see could not be written; the relay itself is unaffected.
                    log.warning("relay of %s: %s", self.cluster.name, exc)
                self._wait(settings.ACTIVATE_RELAY_CHECK_INTERVAL)
        finally:
            connection.close()

    def _wait(self, seconds: float) -> None:
        """Until the next check, waking at once when the relay or its connection dies."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            tunnel = self.tunnel
            if tunnel is not None and tunnel.visibly_broken():
                return
            self._stop.wait(TROUBLE_POLL)

    def step(self) -> bool:
        """One check: renew the lease, see that the relay works, set it up again if not.
        Returns False once the lease is lost (the keeper then ends)."""
        if not self.lease.renew():
            self._close()
            log.warning("relay of %s: lease lost; another supervisor keeps it", self.cluster.name)
            return False
        now = timezone.now()
        if self.tunnel is not None:
            problem = self.tunnel.problem()
            if problem is None:
                _note(self.cluster_id, checked_at=now)
                return True
            log.warning("relay of %s lost: %s; setting it up again", self.cluster.name, problem)
            self._close()
            _note(self.cluster_id, state=RelayState.DOWN, last_error=problem, checked_at=now)
        self._set_up()
        return True

    def _set_up(self) -> None:
        address = (
            AgentRelay.objects.filter(cluster_id=self.cluster_id)
            .values_list("address", flat=True)
            .first()
            or ""
        )
        try:
            tunnel = tunnel_for(self.cluster, address)
            endpoint = tunnel.open()
        except SSHError as exc:
            _note(
                self.cluster_id,
                state=RelayState.DOWN,
                last_error=str(exc)[:2000],
                checked_at=timezone.now(),
            )
            log.warning("relay of %s cannot be set up: %s", self.cluster.name, exc)
            return
        if not self.lease.renew():
            # Setting up outlasted the lease and someone else holds it now: theirs stands.
            tunnel.close()
            return
        self.tunnel = tunnel
        host = self.cluster.relay_host or endpoint.hostname
        now = timezone.now()
        fields: dict[str, object] = {
            "state": RelayState.UP,
            "address": f"[{host}]:{endpoint.port}" if ":" in host else f"{host}:{endpoint.port}",
            "forwarded_port": endpoint.forwarded_port,
            "holder": self.holder,
            "last_error": "",
            "up_since": now,
            "checked_at": now,
            "updated_at": now,
        }
        if self.was_up:
            fields["repairs"] = F("repairs") + 1
        self.was_up = True
        _note(self.cluster_id, **fields)
        if not address:
            # The first address agents can be given: what waited for it goes now, not at the
            # end of its backoff.
            Worker.objects.filter(cluster_id=self.cluster_id, status=WorkerStatus.PENDING).update(
                next_attempt_at=now
            )

    def _close(self) -> None:
        tunnel, self.tunnel = self.tunnel, None
        if tunnel is not None:
            tunnel.close()


class RelaySupervisor:
    """What one `run_relays` process keeps: a keeper per via-login-host cluster whose lease it
    could take. Another process holding a lease is left alone; its keeper's death frees it."""

    def __init__(self) -> None:
        self.holder = holder_name()
        self.keepers: dict[int, RelayKeeper] = {}

    def step(self) -> int:
        """Start, stop and restart keepers to match the clusters; returns how many it holds."""
        close_old_connections()
        wanted = {
            cluster.pk: cluster
            for cluster in Cluster.objects.filter(agent_route=AgentRoute.VIA_LOGIN_HOST)
        }
        for cluster_id, keeper in list(self.keepers.items()):
            cluster = wanted.get(cluster_id)
            if cluster is None:
                keeper.stop(state=RelayState.STOPPED, why="the cluster's agents go direct now")
            elif keeper.fingerprint != relay_fingerprint(cluster):
                keeper.stop(state=RelayState.DOWN, why="the cluster's settings changed")
            elif not keeper.is_alive():
                keeper.stop(state=RelayState.DOWN, why="its keeper ended")
            else:
                continue
            del self.keepers[cluster_id]
        for cluster_id, cluster in wanted.items():
            if cluster_id in self.keepers:
                continue
            lease = Lease(cluster_id)
            if lease.take():
                keeper = RelayKeeper(cluster, lease, holder=self.holder)
                self.keepers[cluster_id] = keeper
                keeper.start()
        stop_unwanted_relays()
        return len(self.keepers)

    def stop_all(self) -> None:
        for keeper in self.keepers.values():
            keeper.stop(state=RelayState.DOWN, why=f"run_relays {self.holder} stopped")
        self.keepers.clear()

"""Keeping one cluster's relay up: a keeper thread checks the SSH connection and the relay
process while it holds the cluster's lease, and sets both up again when either is lost."""

from __future__ import annotations

import logging
import re
import threading
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import F
from django.utils import timezone

from agents.relays.lease import Lease
from core.transport.errors import SSHError
from core.transport.tunnel import RelayTunnel
from node import relay_source
from workers_app.actions import lifecycle
from workers_app.cluster_access import new_connection
from workers_app.models import AgentRelay, Cluster, RelayState
from workers_app.relays.addresses import relay_fingerprint, relay_tag, upstream_address
from workers_app.relays.records import Holding, note, note_shedding, note_started

log = logging.getLogger(__name__)
# How often a keeper looks for a dead relay or connection between its full checks.
TROUBLE_POLL = 0.1
# What the relay prints on stderr when it could not pass calls: how many in all, so far.
SHED_REPORT = re.compile(r"shed=(\d+)")


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
        # Calls the current relay reported it shed, as last noted.
        self.shed_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"relay-keeper-{cluster.name}", daemon=True
        )

    def start(self) -> None:
        # Taken over from a supervisor that had it running: setting it up again is a repair.
        self.was_up = note_started(self.cluster_id, self.holding) in (
            RelayState.UP,
            RelayState.DOWN,
        )
        self._thread.start()

    @property
    def holding(self) -> Holding:
        """What the keeper's writes to the row carry: its holder and lease number (fence)."""
        return Holding(self.holder, self.lease.number)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, state: str, why: str) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=settings.ACTIVATE_SSH_CONNECT_TIMEOUT * 3)
        self._close()
        # A keeper that lost its lease says nothing more: the row is its successor's now.
        if self.lease.held():
            note(
                self.cluster_id,
                self.holding,
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
        if not self._renew():
            self._close()
            log.warning("relay of %s: lease lost; another supervisor keeps it", self.cluster.name)
            return False
        now = timezone.now()
        if self.tunnel is not None:
            problem = self.tunnel.problem()
            if problem is None:
                self._note_shedding(self.tunnel.stderr_text())
                return self._noted(checked_at=now)
            log.warning("relay of %s lost: %s; setting it up again", self.cluster.name, problem)
            self._close()
            if not self._noted(state=RelayState.DOWN, last_error=problem, checked_at=now):
                return False
        return self._set_up()

    def _renew(self) -> bool:
        """Renew the lease; one that lapsed and was taken again with nobody between has a new
        number, which the row follows while it is still the old holding's."""
        before = self.holding
        if not self.lease.renew():
            return False
        if self.lease.number == before.number:
            return True
        return note(self.cluster_id, before, fence=self.lease.number)

    def _noted(self, **fields: object) -> bool:
        """Write to the row, if it is still this holding's; if not, a later holding took it
        (the lease was lost between the renewal and now): close the relay and end."""
        if note(self.cluster_id, self.holding, **fields):
            return True
        self._close()
        log.warning("relay of %s: its row is a later holding's; ending", self.cluster.name)
        return False

    def _note_shedding(self, said: str) -> None:
        """A relay that shed calls since the last check (connections made to give way, refused
        for want of slots, or the platform not reached) may have shed agents' beats: their
        silence is not theirs, as when the relay is down."""
        reports = SHED_REPORT.findall(said)
        shed = int(reports[-1]) if reports else 0
        if shed <= self.shed_seen:
            return
        if not self.shed_seen:
            log.warning("relay of %s sheds calls: %s", self.cluster.name, said[-300:])
        self.shed_seen = shed
        note_shedding(
            self.cluster_id, self.holding, report=said[said.rfind("shed=") :], now=timezone.now()
        )

    def _set_up(self) -> bool:
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
            log.warning("relay of %s cannot be set up: %s", self.cluster.name, exc)
            return self._noted(
                state=RelayState.DOWN, last_error=str(exc)[:2000], checked_at=timezone.now()
            )
        if not self._renew():
            # Setting up outlasted the lease and someone else holds it now: theirs stands.
            tunnel.close()
            return False
        self.tunnel = tunnel
        self.shed_seen = 0
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
        if not self._noted(**fields):
            return False
        if not address:
            # The first address agents can be given: what waited for it goes now, not at the
            # end of its backoff.
            lifecycle.attempt_pending_now(self.cluster_id, now=now)
        return True

    def _close(self) -> None:
        tunnel, self.tunnel = self.tunnel, None
        if tunnel is not None:
            tunnel.close()

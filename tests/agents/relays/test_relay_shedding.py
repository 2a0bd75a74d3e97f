"""A relay that sheds calls (connections made to give way, refused for want of slots, the
platform not reached) is a platform-side fault: its keeper reads the relay's reports on stderr
and records them, and the heartbeat sweep gives the cluster's workers the grace it gives them
while the relay is down, until the relay has passed every call for a whole heartbeat timeout."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.relays import RelayKeeper
from agents.relays.lease import Lease
from tests.agents.relays.test_relays import via_login_host
from tests.factories import WorkerFactory
from workers_app import sweeps
from workers_app.actions import lifecycle
from workers_app.liveness import Liveness
from workers_app.models import AgentRelay, RelayState, Worker
from workers_app.statuses import WorkerStatus

REPORT = "[activate-relay 10:00:0{n}] shed={shed} (evicted {shed}); last: -"


class ReportingTunnel:
    """A relay and connection that work, and what the relay said on stderr so far."""

    def __init__(self) -> None:
        self.said = ""

    def problem(self) -> None:
        return None

    def visibly_broken(self) -> bool:
        return False

    def stderr_text(self) -> str:
        return self.said

    def close(self) -> None:
        pass


@pytest.fixture
def keeper(make_cluster: Any) -> Iterator[Any]:
    cluster = via_login_host(make_cluster)
    lease = Lease(cluster.pk)
    assert lease.take()
    keeper = RelayKeeper(cluster, lease, holder="test:1")
    keeper.tunnel = ReportingTunnel()  # type: ignore[assignment]
    yield keeper
    lease.release()


def silent_connected_worker(cluster: Any) -> Worker:
    worker = WorkerFactory(cluster=cluster)
    lifecycle.mark_submitted(worker, job_id="7")
    lifecycle.mark_connected(worker, hostname="n1")
    Liveness().forget(worker.pk)
    return worker


@pytest.mark.django_db
def test_a_relay_shedding_calls_keeps_its_clusters_silent_workers_until_a_timeout_without(
    keeper: Any, settings: Any
) -> None:
    cluster = keeper.cluster
    timeout = timedelta(seconds=settings.ACTIVATE_HEARTBEAT_TIMEOUT)
    long_ago = timezone.now() - 2 * timeout
    # The keeper's row (as its start made it), up for long
    AgentRelay.objects.create(
        cluster=cluster,
        state=RelayState.UP,
        up_since=long_ago,
        checked_at=timezone.now(),
        holder=keeper.holder,
        fence=keeper.lease.number,
    )
    Liveness().claim_reset()
    worker = silent_connected_worker(cluster)

    # Given: the relay reports it shed calls. When: its keeper checks it.
    keeper.tunnel.said = REPORT.format(n=1, shed=40)
    assert keeper.step()
    # Then: the record says so, and counts the relay up only from now.
    relay = AgentRelay.objects.get(cluster=cluster)
    assert relay.state == RelayState.UP and relay.up_since > long_ago
    assert "shed=40" in relay.last_error
    # And: the sweep reads the silence as the relay's: nobody is stopped.
    assert sweeps.sweep_heartbeats() == 0
    assert Worker.objects.get(pk=worker.pk).status == WorkerStatus.CONNECTED

    # Given: nothing more shed since (the same report). Then: the record stays as it was.
    noted = relay.up_since
    assert keeper.step()
    assert AgentRelay.objects.get(cluster=cluster).up_since == noted
    # More shed: noted again.
    keeper.tunnel.said += " " + REPORT.format(n=2, shed=41)
    assert keeper.step()
    assert AgentRelay.objects.get(cluster=cluster).up_since > noted

    # When: a whole heartbeat timeout passes without a call shed. Then: silence counts again.
    AgentRelay.objects.filter(cluster=cluster).update(up_since=long_ago)
    assert keeper.step()
    assert sweeps.sweep_heartbeats() == 1
    assert Worker.objects.get(pk=worker.pk).status == WorkerStatus.STOPPED

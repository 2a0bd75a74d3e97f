"""Agent routes in the platform: what job scripts are told, the lease that keeps one relay per
cluster and installation, and the supervisor starting and stopping relays on the real login
host (the test cluster's sshd) as clusters come, change and go."""

from __future__ import annotations

import random
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from agents.relays import RelaySupervisor, tunnel_for
from agents.relays.lease import Lease
from core.transport.errors import SSHError
from harness.relays import relay_pids
from harness.waiting import wait_for
from tests.factories import UserFactory, WorkerFactory
from workers_app import relays, sweeps
from workers_app.actions import jobs, lifecycle, requests
from workers_app.cluster_access import connection_for
from workers_app.liveness import Liveness
from workers_app.models import (
    AgentRelay,
    AgentRoute,
    Cluster,
    Environment,
    EnvironmentField,
    RelayState,
    Worker,
)
from workers_app.relays import RelayNotReady, agent_url_for, relay_tag
from workers_app.statuses import WorkerStatus


def via_login_host(make_cluster: Any, **overrides: object) -> Cluster:
    cluster: Cluster = make_cluster(
        name="relayed", agent_route=AgentRoute.VIA_LOGIN_HOST, relay_host="127.0.0.1", **overrides
    )
    return cluster


@pytest.mark.django_db
def test_job_scripts_of_a_direct_cluster_name_the_agents_server(
    make_cluster: Any, settings: Any
) -> None:
    settings.ACTIVATE_AGENT_URL = "http://agents.example.org:8001"
    assert agent_url_for(make_cluster()) == "http://agents.example.org:8001"


@pytest.mark.django_db
def test_job_scripts_via_the_login_host_name_the_relay_once_it_has_an_address(
    make_cluster: Any,
) -> None:
    cluster = via_login_host(make_cluster)
    with pytest.raises(RelayNotReady):
        agent_url_for(cluster)
    AgentRelay.objects.create(cluster=cluster, address="login1:40123", state=RelayState.DOWN)
    # Down or up, the address stays: agents retry it until the relay is back.
    assert agent_url_for(cluster) == "http://login1:40123"


@pytest.mark.django_db
def test_a_worker_waits_pending_until_the_relay_has_an_address(make_cluster: Any) -> None:
    cluster = via_login_host(make_cluster)
    environment = Environment.objects.create(cluster=cluster, name="compute", partition="debug")
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    worker = requests.request_worker(
        owner=UserFactory(), cluster=cluster.name, environment=environment.name
    )
    jobs.submit_worker(worker.pk)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING
    assert worker.status_reason == (
        "Waiting for cluster relayed: the relay on the login host of relayed is not up yet"
    )
    assert worker.next_attempt_at is not None and worker.next_attempt_at > timezone.now()
    cluster.refresh_from_db()
    assert cluster.reachability != "offline"  # nothing is wrong with the cluster itself


@pytest.mark.django_db
def test_the_relay_runs_as_the_clusters_own_account(make_cluster: Any) -> None:
    cluster = make_cluster(agent_route=AgentRoute.VIA_LOGIN_HOST, username="")
    with pytest.raises(ValidationError, match="cluster's own account"):
        cluster.full_clean()


@pytest.mark.django_db
def test_a_relay_nobody_confirms_shows_as_unknown(make_cluster: Any, settings: Any) -> None:
    now = timezone.now()
    relay = AgentRelay(cluster=make_cluster(), state=RelayState.UP, checked_at=now)
    assert relay.state_now(now) == RelayState.UP
    later = now + timedelta(seconds=settings.ACTIVATE_RELAY_LEASE + 1)
    assert relay.state_now(later) == RelayState.UNKNOWN
    relay.state = RelayState.STOPPED
    assert relay.state_now(later) == RelayState.STOPPED


@pytest.mark.django_db
def test_a_relay_has_a_connection_of_its_own_as_the_clusters_own_account(
    make_cluster: Any,
) -> None:
    cluster = via_login_host(make_cluster)
    tunnel = tunnel_for(cluster, "127.0.0.1:40123")
    assert tunnel.connection is not connection_for(cluster)
    assert (tunnel.connection.username, tunnel.connection.max_channels) == (cluster.username, 1)
    assert tunnel.bind_port == 40123  # a repaired relay listens where agents were told

    with pytest.raises(SSHError, match="no account of its own"):
        tunnel_for(make_cluster(name="nobody", username=""), "")


def test_one_lease_holder_per_cluster_and_installation(settings: Any) -> None:
    settings.ACTIVATE_RELAY_LEASE = 0.5
    first, second = Lease(1), Lease(1)
    assert first.take()
    assert not second.take()
    assert first.renew() and first.held()
    # Another installation's relay of its cluster 1 is another lease.
    mine = settings.ACTIVATE_INSTALLATION_ID
    settings.ACTIVATE_INSTALLATION_ID = "other"
    assert Lease(1).take()
    settings.ACTIVATE_INSTALLATION_ID = mine
    first.release()
    assert second.take()
    assert not first.renew() and not first.held()


def test_a_lapsed_lease_is_taken_back_only_if_nobody_took_it(settings: Any) -> None:
    settings.ACTIVATE_RELAY_LEASE = 0.3
    first = Lease(2)
    assert first.take()
    time.sleep(0.4)
    assert not first.held()
    assert first.renew()  # nobody took it meanwhile
    time.sleep(0.4)
    assert Lease(2).take()
    assert not first.renew()


def free_port_outside_the_ephemeral_range() -> int:
    """A port free on IPv4 and IPv6 loopback (the relay binds both) that no outgoing
    connection will take meanwhile: the old port + 1 once was one, and the relay never came up."""
    for port in random.sample(range(20000, 30000), 200):
        try:
            with socket.socket(socket.AF_INET) as v4, socket.socket(socket.AF_INET6) as v6:
                v4.bind(("127.0.0.1", port))
                v6.bind(("::1", port))
        except OSError:
            continue
        return port
    raise AssertionError("no free port found")


@pytest.mark.slurm
@pytest.mark.django_db(transaction=True)
def test_the_supervisor_sets_up_changes_and_stops_relays_with_their_clusters(
    make_cluster: Any,
) -> None:
    cluster = via_login_host(make_cluster)
    tag = relay_tag(cluster)
    waiting = WorkerFactory(cluster=cluster)
    Worker.objects.filter(pk=waiting.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    supervisor = RelaySupervisor()
    try:
        assert supervisor.step() == 1
        wait_for(
            lambda: AgentRelay.objects.filter(cluster=cluster, state=RelayState.UP).exists(),
            timeout=30,
        )
        relay = AgentRelay.objects.get(cluster=cluster)
        assert relay.address.startswith("127.0.0.1:") and relay.holder == supervisor.holder
        # A worker that waited for the relay's first address is sent now, not after its backoff
        # (made due by the keeper's thread just after it marks the relay up).
        wait_for(
            lambda: Worker.objects.filter(
                pk=waiting.pk, next_attempt_at__lte=timezone.now()
            ).exists(),
            timeout=5,
        )
        assert len(relay_pids(tag)) == 1
        # A new fixed port is a new relay, there.
        first_pid = relay_pids(tag)[0]
        cluster.relay_port = free_port_outside_the_ephemeral_range()
        cluster.save()
        supervisor.step()
        wait_for(
            lambda: (
                AgentRelay.objects.get(cluster=cluster).address == f"127.0.0.1:{cluster.relay_port}"
            ),
            timeout=30,
        )
        wait_for(lambda: relay_pids(tag) and first_pid not in relay_pids(tag), timeout=10)
        # The cluster goes: its relay on the login host ends with the keeper's connection.
        cluster_id = cluster.pk
        Worker.objects.filter(cluster=cluster).delete()
        cluster.delete()
        assert supervisor.step() == 0
        wait_for(lambda: not relay_pids(tag), timeout=10)
        assert not AgentRelay.objects.filter(cluster_id=cluster_id).exists()
    finally:
        supervisor.stop_all()
    assert relays.stop_unwanted_relays() == 0


@pytest.mark.django_db
def test_the_admin_shows_each_clusters_agent_route_and_its_relay(
    admin_client: Client, make_cluster: Any
) -> None:
    direct = make_cluster(name="near")
    relayed = via_login_host(make_cluster)
    AgentRelay.objects.create(
        cluster=relayed,
        state=RelayState.UP,
        address="127.0.0.1:40999",
        holder="platform1:4242",
        repairs=3,
        checked_at=timezone.now(),
    )
    listing = admin_client.get("/admin/workers_app/cluster/").content.decode()
    assert "via login host: relay up" in listing and "direct" in listing
    page = admin_client.get(f"/admin/workers_app/cluster/{relayed.pk}/change/").content.decode()
    assert "agents are given 127.0.0.1:40999" in page
    assert "kept by platform1:4242" in page and "repaired 3 times" in page

    # The relay runs as the cluster's own account: a cluster without one cannot use it.
    form = {
        "name": "near",
        "host": direct.host,
        "port": str(direct.port),
        "username": "",
        "host_key": direct.host_key,
        "scheduler": "slurm",
        "agent_route": "via_login_host",
        "relay_port": "0",
        "environments-TOTAL_FORMS": "0",
        "environments-INITIAL_FORMS": "0",
    }
    answer = admin_client.post(f"/admin/workers_app/cluster/{direct.pk}/change/", form)
    assert answer.status_code == 200
    assert "The relay runs as the cluster&#x27;s own account" in answer.content.decode()
    direct.refresh_from_db()
    assert direct.agent_route == AgentRoute.DIRECT


@pytest.mark.django_db
def test_silence_counts_only_once_the_relay_has_been_up_for_a_heartbeat_timeout(
    make_cluster: Any, settings: Any
) -> None:
    cluster = via_login_host(make_cluster)
    worker = WorkerFactory(cluster=cluster)
    lifecycle.mark_submitted(worker, job_id="5")
    store = Liveness()
    store.claim_reset()
    lifecycle.mark_connected(worker, hostname="n1")
    store.forget(worker.pk)
    now = timezone.now()
    timeout = timedelta(seconds=settings.ACTIVATE_HEARTBEAT_TIMEOUT)

    # No relay yet, then down: the agent could not have been heard.
    assert sweeps.sweep_heartbeats() == 0
    relay = AgentRelay.objects.create(cluster=cluster, state=RelayState.DOWN, checked_at=now)
    assert sweeps.sweep_heartbeats() == 0
    # Up again, but for less than a timeout: an agent may not have got through yet.
    AgentRelay.objects.filter(pk=relay.pk).update(state=RelayState.UP, up_since=now)
    assert sweeps.sweep_heartbeats() == 0
    # Up for longer than the timeout: that silence is the agent's own.
    AgentRelay.objects.filter(pk=relay.pk).update(up_since=now - timeout - timedelta(seconds=1))
    assert sweeps.sweep_heartbeats() == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED

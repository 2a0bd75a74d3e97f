"""A platform that cannot hear its agents must not blame them: gaps on the platform's side give
every connected worker a fresh grace period, and a mass silence waits for an operator."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from core import redis_connection
from tests.factories import WorkerFactory
from workers_app import sweeps
from workers_app.actions import lifecycle
from workers_app.liveness import Breakers, Liveness, SweepRecord
from workers_app.models import Cluster, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db(transaction=True)


def connected_worker(**fields: object) -> Worker:
    worker = WorkerFactory(**fields)
    lifecycle.mark_submitted(worker, job_id="5")
    Liveness().beat(worker.pk)
    lifecycle.mark_connected(worker, hostname="n1")
    return worker


@pytest.fixture
def store() -> Liveness:
    store = Liveness()
    store.claim_reset()
    return store


@pytest.fixture
def hearing(settings, live_server) -> None:
    """The agents' endpoint answers: a real server the sweep asks, as in production."""
    settings.ACTIVATE_HEARING_PROBE = True
    settings.ACTIVATE_AGENT_URL = live_server.url


def status(worker: Worker) -> str:
    worker.refresh_from_db()
    return worker.status


def test_a_silent_worker_is_stopped_while_the_platform_demonstrably_hears(
    store: Liveness, hearing: None
) -> None:
    alive, silent = connected_worker(), connected_worker()
    SweepRecord().note_sweep(time.time())
    store.forget(silent.pk)

    assert sweeps.sweep_heartbeats(store=store) == 1
    assert (status(silent), status(alive)) == (S.STOPPED, S.CONNECTED)


def test_while_the_agents_endpoint_does_not_answer_nobody_is_stopped_then_all_get_grace(
    store: Liveness, settings, live_server
) -> None:
    settings.ACTIVATE_HEARING_PROBE = True
    settings.ACTIVATE_AGENT_URL = "http://127.0.0.1:9"  # the agents' server is down
    workers = [connected_worker() for _ in range(2)]
    SweepRecord().note_sweep(time.time())
    for worker in workers:
        store.forget(worker.pk)  # their beats could not arrive

    assert sweeps.sweep_heartbeats(store=store) == 0
    assert sweeps.sweep_heartbeats(store=store) == 0
    assert {status(w) for w in workers} == {S.CONNECTED}

    settings.ACTIVATE_AGENT_URL = live_server.url  # the agents' server is back
    assert sweeps.sweep_heartbeats(store=store) == 0
    assert store.alive([w.pk for w in workers]) == {w.pk for w in workers}
    # A worker that stays silent after the grace is stopped as usual.
    store.forget(workers[0].pk)
    assert sweeps.sweep_heartbeats(store=store) == 1
    assert (status(workers[0]), status(workers[1])) == (S.STOPPED, S.CONNECTED)


def test_when_the_sweeps_themselves_stopped_for_a_while_everyone_gets_grace(
    store: Liveness, hearing: None, settings
) -> None:
    worker = connected_worker()
    SweepRecord().note_sweep(
        time.time() - 10 * settings.ACTIVATE_SWEEP_INTERVAL
    )  # e.g. Redis or DB down
    store.forget(worker.pk)

    assert sweeps.sweep_heartbeats(store=store) == 0
    assert status(worker) == S.CONNECTED and store.alive([worker.pk]) == {worker.pk}


def test_too_many_silent_at_once_on_one_cluster_waits_for_an_operator(
    store: Liveness, hearing: None, admin_client: Client
) -> None:
    first = connected_worker()
    cluster = first.cluster
    workers = [first] + [connected_worker(cluster=cluster) for _ in range(3)]
    lone = connected_worker()  # on a cluster of its own
    SweepRecord().note_sweep(time.time())
    for worker in [*workers[:3], lone]:
        store.forget(worker.pk)

    assert sweeps.sweep_heartbeats(store=store) == 1  # only the lone one: its own cluster's 1 of 1
    assert {status(w) for w in workers} == {S.CONNECTED}
    assert set(Breakers().all_open()) == {cluster.pk}
    page = admin_client.get("/admin/workers_app/cluster/").content.decode()
    assert "3 of 4 silent" in page

    admin_client.post(
        "/admin/workers_app/cluster/",
        {"action": "confirm_lost_workers", "_selected_action": [cluster.pk]},
    )
    assert sweeps.sweep_heartbeats(store=store) == 3
    assert [status(w) for w in workers] == [S.STOPPED, S.STOPPED, S.STOPPED, S.CONNECTED]
    assert Breakers().all_open() == {}
    assert Cluster.objects.filter(pk=cluster.pk).exists()


def test_the_agents_ping_answers_only_when_redis_answers(client: Client, settings) -> None:
    assert client.get("/agent/v1/ping").status_code == 200
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    redis_connection._client.cache_clear()
    try:
        assert client.get("/agent/v1/ping").status_code == 503
    finally:
        redis_connection._client.cache_clear()


def test_a_store_that_goes_back_to_an_older_copy_mid_sweep_gives_grace_not_silence(
    store: Liveness, hearing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis restored from a snapshot while the sweep reads it: the sweep read a recent last
    # sweep, then keys that had expired in the older copy (and its older last sweep).
    workers = [connected_worker() for _ in range(2)]
    SweepRecord().note_sweep(time.time())
    read = store.alive

    def restored_meanwhile(worker_ids: list[int]) -> set[int]:
        SweepRecord().note_sweep(time.time() - 8)
        for worker in workers:
            store.forget(worker.pk)
        return read(worker_ids)

    monkeypatch.setattr(store, "alive", restored_meanwhile)

    assert sweeps.sweep_heartbeats(store=store) == 0
    monkeypatch.setattr(store, "alive", read)
    assert {status(w) for w in workers} == {S.CONNECTED}
    assert store.alive([w.pk for w in workers]) == {w.pk for w in workers}  # fresh grace
    # After that grace, silence counts again.
    store.forget(workers[0].pk)
    assert sweeps.sweep_heartbeats(store=store) == 1

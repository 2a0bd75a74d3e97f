"""The agent's endpoints: only this worker's secret works, only allowlisted fields are read."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.factories import WorkerFactory
from workers_app import lifecycle
from workers_app.agents.heartbeats import HeartbeatStore
from workers_app.models import Worker, WorkerEvent, new_agent_secret
from workers_app.statuses import WorkerStatus

S = WorkerStatus


def queued_worker_with_secret() -> tuple[Worker, str]:
    worker = WorkerFactory()
    secret, secret_hash = new_agent_secret()
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=secret_hash)
    worker.refresh_from_db()
    lifecycle.mark_submitted(worker, job_id="123")
    return worker, secret


def post(client: Client, path: str, secret: str, body: dict[str, object]) -> tuple[int, dict]:
    response = client.post(
        f"/agent/v1/{path}",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )
    return response.status_code, response.json()


@pytest.mark.django_db
def test_when_the_agent_connects_then_the_worker_is_connected_with_its_hostname(
    client: Client,
) -> None:
    worker, secret = queued_worker_with_secret()
    status, body = post(
        client,
        "connect",
        secret,
        {"worker": worker.public_id, "hostname": "node7", "job_id": "123"},
    )
    assert status == 200 and body["heartbeat_interval"] > 0
    worker.refresh_from_db()
    assert (worker.status, worker.node_hostname) == (S.CONNECTED, "node7")
    assert HeartbeatStore().alive([worker.pk]) == {worker.pk}


@pytest.mark.django_db
def test_a_forged_or_other_workers_secret_gets_403_and_changes_nothing(client: Client) -> None:
    worker, _secret = queued_worker_with_secret()
    _other, other_secret = queued_worker_with_secret()
    events = WorkerEvent.objects.count()
    for secret in ("forged-secret", other_secret):
        for path in ("connect", "heartbeat"):
            status, _ = post(client, path, secret, {"worker": worker.public_id, "hostname": "evil"})
            assert status == 403
    worker.refresh_from_db()
    assert worker.status == S.QUEUED and worker.node_hostname == ""
    assert WorkerEvent.objects.count() == events
    assert HeartbeatStore().alive([worker.pk]) == set()


@pytest.mark.django_db
def test_a_connected_workers_heartbeat_uses_its_cached_identity_but_still_checks_the_secret(
    client: Client, django_assert_num_queries
) -> None:
    worker, secret = queued_worker_with_secret()
    post(client, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    store = HeartbeatStore()
    store.forget(worker.pk)
    assert post(client, "heartbeat", "wrong", {"worker": worker.public_id})[0] == 403
    assert store.alive([worker.pk]) == set()
    with django_assert_num_queries(1):  # the coarse last-seen time, once a minute
        assert post(client, "heartbeat", secret, {"worker": worker.public_id})[0] == 200
    assert store.alive([worker.pk]) == {worker.pk}
    assert Worker.objects.get(pk=worker.pk).last_heartbeat_at is not None
    with django_assert_num_queries(0):
        assert post(client, "heartbeat", secret, {"worker": worker.public_id})[0] == 200


@pytest.mark.django_db
def test_fields_outside_the_allowlist_are_ignored(client: Client) -> None:
    worker, secret = queued_worker_with_secret()
    status, _ = post(
        client,
        "connect",
        secret,
        {"worker": worker.public_id, "hostname": "n1", "status": "stopped", "owner_id": "1"},
    )
    assert status == 200
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED


@pytest.mark.django_db
@pytest.mark.parametrize("hostname", ["", "bad host", "a;rm -rf /", "x" * 300])
def test_a_malformed_hostname_is_refused(client: Client, hostname: str) -> None:
    worker, secret = queued_worker_with_secret()
    status, _ = post(client, "connect", secret, {"worker": worker.public_id, "hostname": hostname})
    assert status == 400
    worker.refresh_from_db()
    assert worker.status == S.QUEUED


@pytest.mark.django_db
def test_when_the_worker_has_ended_then_the_agent_is_told_to_go(
    client: Client,
    django_capture_on_commit_callbacks,
) -> None:
    worker, secret = queued_worker_with_secret()
    post(client, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.request_stop(worker)
    assert post(client, "heartbeat", secret, {"worker": worker.public_id})[0] == 410
    assert post(client, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})[0] == 410


@pytest.mark.django_db
def test_an_agent_that_calls_before_submission_is_recorded_is_asked_to_retry(
    client: Client,
) -> None:
    worker = WorkerFactory()
    secret, secret_hash = new_agent_secret()
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=secret_hash)
    status, _ = post(client, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    assert status == 409

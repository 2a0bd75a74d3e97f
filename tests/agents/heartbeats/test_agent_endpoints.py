"""The agent's endpoints: only requests signed with this worker's key work, each once, only
allowlisted fields are read, and every answer to a signed request is signed back."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from harness.agents import SignedAgent
from tests.agents.heartbeats.signed import django_post, worker_with_key
from workers_app.actions import lifecycle
from workers_app.agent_keys import issue_agent_key
from workers_app.liveness import Liveness
from workers_app.models import Worker, WorkerEvent
from workers_app.statuses import WorkerStatus

S = WorkerStatus


@pytest.mark.django_db
def test_when_the_agent_connects_then_the_worker_is_connected_with_its_hostname(
    client: Client,
) -> None:
    worker, agent = worker_with_key()
    status, body, signed = django_post(
        client,
        agent,
        "connect",
        {"worker": worker.public_id, "hostname": "node7", "job_id": "123"},
    )
    assert status == 200 and body["heartbeat_interval"] > 0 and signed  # type: ignore[operator]
    worker.refresh_from_db()
    assert (worker.status, worker.node_hostname) == (S.CONNECTED, "node7")
    assert Liveness().alive([worker.pk]) == {worker.pk}


@pytest.mark.django_db
def test_a_forged_key_or_another_workers_key_gets_an_unsigned_401_and_changes_nothing(
    client: Client,
) -> None:
    worker, agent = worker_with_key()
    _other, other = worker_with_key()
    events = WorkerEvent.objects.count()
    forgeries = [
        SignedAgent(worker.public_id, agent.key_id, "0" * 64),
        SignedAgent(worker.public_id, other.key_id, other.key),
    ]
    for forged in forgeries:
        for path in ("connect", "heartbeat"):
            body = {"worker": worker.public_id, "hostname": "evil"}
            status, answer, signed = django_post(client, forged, path, body)
            assert (status, answer, signed) == (401, {"error": "bad signature"}, False)
    worker.refresh_from_db()
    assert worker.status == S.STARTING
    assert WorkerEvent.objects.count() == events
    assert Liveness().alive([worker.pk]) == set()


@pytest.mark.django_db
def test_a_bearer_secret_is_refused_with_a_clear_401(client: Client) -> None:
    worker, agent = worker_with_key()
    response = client.post(
        "/agent/v1/connect",
        data=json.dumps({"worker": worker.public_id, "hostname": "node7"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 401
    assert "bearer" in response.json()["error"] and "ActivateHMAC" in response.json()["error"]
    worker.refresh_from_db()
    assert worker.status == S.STARTING


@pytest.mark.django_db
def test_an_older_attempts_key_is_a_signed_403(client: Client) -> None:
    # Given a job whose submission was attempted again with a new key
    worker, old = worker_with_key()
    Worker.objects.filter(pk=worker.pk).update(
        agent_secret_hash=issue_agent_key(worker.public_id).key_hash
    )
    # Then the older job's agent is told, in the platform's name, that its key is refused
    body = {"worker": worker.public_id, "hostname": "node7"}
    status, _, signed = django_post(client, old, "connect", body)
    assert (status, signed) == (403, True)
    worker.refresh_from_db()
    assert worker.status == S.STARTING


@pytest.mark.django_db
def test_a_connected_workers_heartbeat_uses_its_cached_identity_but_still_checks_the_key(
    client: Client, django_assert_num_queries
) -> None:
    worker, agent = worker_with_key()
    django_post(client, agent, "connect", {"worker": worker.public_id, "hostname": "node7"})
    store = Liveness()
    store.forget(worker.pk)
    forged = SignedAgent(worker.public_id, agent.key_id, "0" * 64)
    assert django_post(client, forged, "heartbeat", {"worker": worker.public_id})[0] == 401
    assert store.alive([worker.pk]) == set()
    with django_assert_num_queries(1):  # the coarse last-seen time, once a minute
        beat = django_post(client, agent, "heartbeat", {"worker": worker.public_id})
        assert (beat[0], beat[2]) == (200, True)
    assert store.alive([worker.pk]) == {worker.pk}
    assert Worker.objects.get(pk=worker.pk).last_heartbeat_at is not None
    with django_assert_num_queries(0):
        assert django_post(client, agent, "heartbeat", {"worker": worker.public_id})[0] == 200


@pytest.mark.django_db
def test_a_signed_request_sent_again_is_refused_unsigned_and_changes_nothing(
    client: Client,
) -> None:
    worker, agent = worker_with_key()
    django_post(client, agent, "connect", {"worker": worker.public_id, "hostname": "node7"})
    body = json.dumps({"worker": worker.public_id}).encode()
    header, _ = agent.signed("/agent/v1/heartbeat", body)

    def send() -> tuple[int, bool]:
        response = client.post(
            "/agent/v1/heartbeat",
            data=body,
            content_type="application/json",
            headers={"Authorization": header},
        )
        return response.status_code, "X-Activate-Signature" in response

    assert send() == (200, True)
    Liveness().forget(worker.pk)
    assert send() == (401, False)
    assert Liveness().alive([worker.pk]) == set()


@pytest.mark.django_db
def test_the_body_must_name_the_worker_that_signed(client: Client) -> None:
    _, agent = worker_with_key()
    other, _ = worker_with_key()
    body = {"worker": other.public_id, "hostname": "node7"}
    status, _, signed = django_post(client, agent, "connect", body)
    assert (status, signed) == (400, True)
    other.refresh_from_db()
    assert other.status == S.STARTING


@pytest.mark.django_db
def test_fields_outside_the_allowlist_are_ignored(client: Client) -> None:
    worker, agent = worker_with_key()
    status, _, _ = django_post(
        client,
        agent,
        "connect",
        {"worker": worker.public_id, "hostname": "node7", "status": "stopped", "owner_id": "1"},
    )
    assert status == 200
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED


@pytest.mark.django_db
@pytest.mark.parametrize("hostname", ["", "bad host", "a;rm -rf /", "x" * 300])
def test_a_malformed_hostname_is_refused(client: Client, hostname: str) -> None:
    worker, agent = worker_with_key()
    body = {"worker": worker.public_id, "hostname": hostname}
    assert django_post(client, agent, "connect", body)[0] == 400
    worker.refresh_from_db()
    assert worker.status == S.STARTING


@pytest.mark.django_db
def test_when_the_worker_has_ended_then_the_agent_is_told_to_go_in_a_signed_answer(
    client: Client,
    django_capture_on_commit_callbacks,
) -> None:
    worker, agent = worker_with_key()
    django_post(client, agent, "connect", {"worker": worker.public_id, "hostname": "node7"})
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.request_stop(worker)
    beat = django_post(client, agent, "heartbeat", {"worker": worker.public_id})
    assert (beat[0], beat[2]) == (410, True)
    connect = django_post(
        client, agent, "connect", {"worker": worker.public_id, "hostname": "node7"}
    )
    assert (connect[0], connect[2]) == (410, True)


@pytest.mark.django_db
def test_an_agent_that_calls_before_submission_is_recorded_is_asked_to_retry(
    client: Client,
) -> None:
    worker, agent = worker_with_key(submitted=False)
    status, _, signed = django_post(
        client, agent, "connect", {"worker": worker.public_id, "hostname": "node7"}
    )
    assert (status, signed) == (409, True)

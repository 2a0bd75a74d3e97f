"""The agents' server as deployed (uvicorn, `scripts/start.sh agents`): heartbeats answered by
the lean ASGI path with the view's checks, every other path still Django's. Real processes,
real Redis and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.platform import Platform
from tests.factories import WorkerFactory
from workers_app import lifecycle
from workers_app.agents.heartbeats import PREFIX, SEEN_PREFIX, HeartbeatStore
from workers_app.models import Worker, WorkerEvent, new_agent_secret
from workers_app.redis_connection import redis_client
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


@pytest.fixture
def agents(platform: Platform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=platform.agent_url, timeout=10) as client:
        yield client


def queued_worker_with_secret() -> tuple[Worker, str]:
    worker = WorkerFactory()
    secret, secret_hash = new_agent_secret()
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=secret_hash)
    worker.refresh_from_db()
    lifecycle.mark_submitted(worker, job_id="123")
    return worker, secret


def post(client: httpx.Client, path: str, secret: str, body: object) -> httpx.Response:
    return client.post(
        f"/agent/v1/{path}",
        content=body if isinstance(body, bytes) else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )


def test_a_connected_agent_beats_and_its_key_is_refreshed(agents: httpx.Client) -> None:
    # Given an agent that connected through the server
    worker, secret = queued_worker_with_secret()
    connect = {"worker": worker.public_id, "hostname": "n1", "job_id": "123"}
    assert post(agents, "connect", secret, connect).status_code == 200
    redis_client().delete(f"{PREFIX}{worker.pk}")
    # When it beats (unknown fields are ignored)
    beat = post(agents, "heartbeat", secret, {"worker": worker.public_id, "status": "root"})
    # Then the answer is the view's, and the liveness key is back
    assert (beat.status_code, beat.json()) == (200, {"status": "ok"})
    assert beat.headers["content-type"] == "application/json"
    assert HeartbeatStore().alive([worker.pk]) == {worker.pk}
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED


def test_the_first_beat_in_a_minute_writes_last_seen_and_the_next_do_not(
    agents: httpx.Client,
) -> None:
    worker, secret = queued_worker_with_secret()
    post(agents, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    redis_client().delete(f"{SEEN_PREFIX}{worker.pk}")

    assert post(agents, "heartbeat", secret, {"worker": worker.public_id}).status_code == 200
    worker.refresh_from_db()
    first = worker.last_heartbeat_at
    assert first is not None
    assert post(agents, "heartbeat", secret, {"worker": worker.public_id}).status_code == 200
    worker.refresh_from_db()
    assert worker.last_heartbeat_at == first


def test_a_wrong_or_other_workers_secret_gets_403_and_refreshes_nothing(
    agents: httpx.Client,
) -> None:
    worker, secret = queued_worker_with_secret()
    other, other_secret = queued_worker_with_secret()
    for w, s in ((worker, secret), (other, other_secret)):
        post(agents, "connect", s, {"worker": w.public_id, "hostname": "n1"})
    redis_client().delete(f"{PREFIX}{worker.pk}")
    events = WorkerEvent.objects.count()

    for forged in ("forged", other_secret):
        beat = post(agents, "heartbeat", forged, {"worker": worker.public_id})
        assert (beat.status_code, beat.json()) == (403, {"error": "forbidden"})
    assert HeartbeatStore().alive([worker.pk]) == set()
    assert WorkerEvent.objects.count() == events


def test_an_agent_that_never_connected_is_told_to_connect_first(agents: httpx.Client) -> None:
    # Its identity is not cached: the beat goes to the database, as the view's does.
    worker, secret = queued_worker_with_secret()
    beat = post(agents, "heartbeat", secret, {"worker": worker.public_id})
    assert (beat.status_code, beat.json()) == (409, {"error": "connect first"})
    assert post(agents, "heartbeat", secret, {"worker": "nosuchworker"}).status_code == 403


@pytest.mark.parametrize(
    ("body", "headers", "status", "error"),
    [
        (b"x" * 5000, {}, 400, "request body too large"),
        (b"not json", {}, 400, "body must be JSON"),
        (b'{"worker": 7}', {}, 400, "body must be a JSON object of strings"),
        (b'{"worker": "../x"}', {}, 400, "worker: missing or malformed"),
        (b'{"worker": "abc"}', {"Authorization": "Basic abc"}, 403, "missing bearer secret"),
    ],
)
def test_malformed_beats_are_refused_with_the_views_answers(
    agents: httpx.Client, body: bytes, headers: dict[str, str], status: int, error: str
) -> None:
    answer = agents.post(
        "/agent/v1/heartbeat", content=body, headers={"Authorization": "Bearer s", **headers}
    )
    assert (answer.status_code, answer.json()) == (status, {"error": error})


def test_every_other_path_is_djangos(agents: httpx.Client) -> None:
    assert agents.get("/agent/v1/ping").json() == {"status": "ok"}
    assert agents.get("/agent/v1/heartbeat").status_code == 405
    assert agents.post("/agent/v1/connect", json={}).status_code == 400
    for path in ("/", "/api/workers/", "/admin/", "/health/"):
        assert agents.get(path).status_code == 404


def test_the_access_log_has_every_request_but_the_successful_beats(
    platform: Platform, agents: httpx.Client
) -> None:
    worker, secret = queued_worker_with_secret()
    post(agents, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    for _ in range(3):
        assert post(agents, "heartbeat", secret, {"worker": worker.public_id}).status_code == 200
    assert post(agents, "heartbeat", "forged", {"worker": worker.public_id}).status_code == 403

    assert platform.log_count('"POST /agent/v1/connect HTTP/1.1" 200') == 1
    assert platform.log_count('"POST /agent/v1/heartbeat HTTP/1.1" 403') == 1
    assert platform.log_count('"POST /agent/v1/heartbeat HTTP/1.1" 200') == 0


def test_after_redis_loses_its_data_the_next_beat_finds_the_agent_again(
    agents: httpx.Client,
) -> None:
    # Given a connected agent, when Redis loses every key (restart, flush, failover)
    worker, secret = queued_worker_with_secret()
    post(agents, "connect", secret, {"worker": worker.public_id, "hostname": "n1"})
    redis_client().flushdb()
    # Then its next beats go to the database once, are accepted, and it is alive again
    beats = [post(agents, "heartbeat", secret, {"worker": worker.public_id}) for _ in range(3)]

    assert [b.status_code for b in beats] == [200, 200, 200]
    assert HeartbeatStore().alive([worker.pk]) == {worker.pk}

"""The agents' server as deployed (uvicorn, `scripts/start.sh agents`): heartbeats answered by
the lean ASGI path with the view's checks (signature, window, nonce) and signed answers, every
other path still Django's. Real processes, real Redis and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from django.db import transaction

from agents.beats import SEEN_PREFIX
from core.redis_connection import redis_client
from harness.agents import AgentAnswer, SignedAgent
from harness.platform import Platform
from harness.waiting import poll
from node import activate_agent
from tests.agents.heartbeats.signed import worker_with_key
from workers_app import idle
from workers_app.idle import ACTIVITY_PREFIX
from workers_app.liveness import PREFIX, Liveness
from workers_app.models import Worker, WorkerEvent
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def agents_server(workdir: Path) -> Iterator[Platform]:
    platform = Platform(workdir=workdir)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


@pytest.fixture(scope="module")
def shared_platform(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """One agents' server for the module's tests: each makes workers and keys of its own."""
    with agents_server(tmp_path_factory.mktemp("agents")) as platform:
        yield platform


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    """An agents' server of the test's own, for a test that reads its access log."""
    with agents_server(tmp_path) as platform:
        yield platform


@pytest.fixture
def agents(shared_platform: Platform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_platform.agent_url, timeout=10) as client:
        yield client


def post(client: httpx.Client, path: str, agent: SignedAgent, body: dict[str, str]) -> AgentAnswer:
    return agent.post(client, f"/agent/v1/{path}", dict(body))


def test_a_connected_agent_beats_its_key_is_refreshed_and_the_answer_is_signed(
    agents: httpx.Client,
) -> None:
    # Given an agent that connected through the server
    worker, agent = worker_with_key()
    connect = {"worker": worker.public_id, "hostname": "node7", "job_id": "123"}
    assert post(agents, "connect", agent, connect).status_code == 200
    redis_client().delete(f"{PREFIX}{worker.pk}")
    # When it beats (unknown fields are ignored)
    beat = post(agents, "heartbeat", agent, {"worker": worker.public_id, "status": "root"})
    # Then the answer is the view's, signed, and the liveness key is back
    assert (beat.status_code, beat.response.json(), beat.signed) == (200, {"status": "ok"}, True)
    assert beat.response.headers["content-type"] == "application/json"
    assert Liveness().alive([worker.pk]) == {worker.pk}
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED


def test_the_first_beat_in_a_minute_writes_last_seen_and_the_next_do_not(
    agents: httpx.Client,
) -> None:
    worker, agent = worker_with_key()
    post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
    redis_client().delete(f"{SEEN_PREFIX}{worker.pk}")

    assert post(agents, "heartbeat", agent, {"worker": worker.public_id}).status_code == 200
    first = poll(lambda: Worker.objects.get(pk=worker.pk).last_heartbeat_at, timeout=10)
    assert first is not None
    assert post(agents, "heartbeat", agent, {"worker": worker.public_id}).status_code == 200
    time.sleep(0.5)
    assert Worker.objects.get(pk=worker.pk).last_heartbeat_at == first


def test_a_beat_is_answered_while_its_last_seen_write_waits_for_postgresql(
    agents: httpx.Client,
) -> None:
    # Given a connected agent whose worker's row another transaction holds locked
    worker, agent = worker_with_key()
    post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
    redis_client().delete(f"{SEEN_PREFIX}{worker.pk}")
    with transaction.atomic():
        Worker.objects.select_for_update().get(pk=worker.pk)
        # When its first beat of the minute comes
        started = time.monotonic()
        beat = post(agents, "heartbeat", agent, {"worker": worker.public_id})
        answered = time.monotonic() - started
        # Then it is answered without waiting for the "last seen" write, which waits for the lock
        assert (beat.status_code, beat.signed) == (200, True)
        assert answered < 2, f"answered after {answered:.2f} s"
        assert Liveness().alive([worker.pk]) == {worker.pk}
    # and the write lands once the lock is released
    assert poll(lambda: Worker.objects.get(pk=worker.pk).last_heartbeat_at, timeout=10)


def test_a_forged_or_other_workers_key_gets_an_unsigned_401_and_refreshes_nothing(
    agents: httpx.Client,
) -> None:
    worker, agent = worker_with_key()
    other, other_agent = worker_with_key()
    for w, a in ((worker, agent), (other, other_agent)):
        post(agents, "connect", a, {"worker": w.public_id, "hostname": "node7"})
    redis_client().delete(f"{PREFIX}{worker.pk}")
    events = WorkerEvent.objects.count()

    forgeries = [
        SignedAgent(worker.public_id, agent.key_id, "0" * 64),
        SignedAgent(worker.public_id, other_agent.key_id, other_agent.key),
    ]
    for forged in forgeries:
        beat = post(agents, "heartbeat", forged, {"worker": worker.public_id})
        assert (beat.status_code, beat.response.json()) == (401, {"error": "bad signature"})
        assert "x-activate-signature" not in beat.response.headers
    assert Liveness().alive([worker.pk]) == set()
    assert WorkerEvent.objects.count() == events


def test_a_captured_beat_sent_again_is_refused_and_refreshes_nothing(
    agents: httpx.Client,
) -> None:
    # Given a beat as it crossed the wire (a neighbour on the way kept a copy)
    worker, agent = worker_with_key()
    post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
    body = json.dumps({"worker": worker.public_id}).encode()
    header, _ = agent.signed("/agent/v1/heartbeat", body)
    captured = {"Authorization": header, "Content-Type": "application/json"}
    assert agents.post("/agent/v1/heartbeat", content=body, headers=captured).status_code == 200
    redis_client().delete(f"{PREFIX}{worker.pk}")
    events = WorkerEvent.objects.count()
    # When it is sent again, then it is refused, unsigned, and the worker is not kept alive
    again = agents.post("/agent/v1/heartbeat", content=body, headers=captured)
    assert (again.status_code, again.json()) == (401, {"error": "replayed request"})
    assert "x-activate-signature" not in again.headers
    assert Liveness().alive([worker.pk]) == set()
    assert WorkerEvent.objects.count() == events


def test_a_beat_signed_outside_the_window_is_refused(agents: httpx.Client) -> None:
    worker, agent = worker_with_key()
    post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
    redis_client().delete(f"{PREFIX}{worker.pk}")
    body = json.dumps({"worker": worker.public_id}).encode()
    for skew in (-3600, 3600):
        header, nonce = agent.signed("/agent/v1/heartbeat", body, ts=int(time.time()) + skew)
        late = agents.post("/agent/v1/heartbeat", content=body, headers={"Authorization": header})
        # Refused for its time alone: a signed 425 carrying the platform's (Redis's) time
        assert late.status_code == 425 and "window" in late.json()["error"]
        said = float(late.json()["server_time"])
        assert abs(said - redis_client().time()[0]) < 5
        signature = late.headers[activate_agent.SIGNATURE_HEADER]
        assert activate_agent.verified(agent.key, 425, nonce, late.content, signature)
    # and nothing done: no liveness, and the hour-ahead time not kept as the agent's latest
    assert Liveness().alive([worker.pk]) == set()
    assert post(agents, "heartbeat", agent, {"worker": worker.public_id}).status_code == 200


def test_an_agent_that_never_connected_is_told_to_connect_first(agents: httpx.Client) -> None:
    # Its identity is not cached: the beat goes to the database, as the view's does.
    worker, agent = worker_with_key()
    beat = post(agents, "heartbeat", agent, {"worker": worker.public_id})
    assert (beat.status_code, beat.response.json(), beat.signed) == (
        409,
        {"error": "connect first"},
        True,
    )
    worker.delete()
    assert post(agents, "heartbeat", agent, {"worker": worker.public_id}).status_code == 403


@pytest.mark.parametrize(
    ("body", "headers", "status", "error"),
    [
        (b"x" * 5000, {}, 400, "request body too large"),
        (b'{"worker": "abc"}', {"Authorization": "Basic abc"}, 401, "missing ActivateHMAC"),
        (b'{"worker": "abc"}', {}, 401, "a bearer secret is not accepted"),
        (b'{"worker": "abc"}', {"Authorization": "ActivateHMAC worker=abc"}, 401, "malformed"),
    ],
)
def test_malformed_or_unsigned_beats_are_refused_unsigned(
    agents: httpx.Client, body: bytes, headers: dict[str, str], status: int, error: str
) -> None:
    answer = agents.post(
        "/agent/v1/heartbeat", content=body, headers={"Authorization": "Bearer s", **headers}
    )
    assert answer.status_code == status and error in answer.json()["error"]
    assert "x-activate-signature" not in answer.headers


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "body must be JSON"),
        (b'{"worker": 7}', "body must be a JSON object of strings"),
        (b'{"worker": "../x"}', "worker: missing or malformed"),
    ],
)
def test_a_signed_beat_with_a_bad_body_gets_the_views_signed_400(
    agents: httpx.Client, body: bytes, error: str
) -> None:
    _, agent = worker_with_key()
    header, nonce = agent.signed("/agent/v1/heartbeat", body)
    answer = agents.post("/agent/v1/heartbeat", content=body, headers={"Authorization": header})
    assert (answer.status_code, answer.json()) == (400, {"error": error})
    signature = answer.headers["x-activate-signature"]
    assert activate_agent.verified(agent.key, 400, nonce, answer.content, signature)


def test_every_other_path_is_djangos(agents: httpx.Client) -> None:
    assert agents.get("/agent/v1/ping").json() == {"status": "ok"}
    assert agents.get("/agent/v1/heartbeat").status_code == 405
    assert agents.post("/agent/v1/connect", json={}).status_code == 401
    for path in ("/", "/api/workers/", "/admin/", "/health/"):
        assert agents.get(path).status_code == 404


def test_the_access_log_has_every_request_but_the_successful_beats(platform: Platform) -> None:
    with httpx.Client(base_url=platform.agent_url, timeout=10) as agents:
        worker, agent = worker_with_key()
        post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
        for _ in range(3):
            assert post(agents, "heartbeat", agent, {"worker": worker.public_id}).status_code == 200
        forged = SignedAgent(worker.public_id, agent.key_id, "0" * 64)
        assert post(agents, "heartbeat", forged, {"worker": worker.public_id}).status_code == 401

        # The access line is written after the answer has gone, and in the order of the requests:
        # once the last one (the 401) is there, so is every line before it.
        refused = '"POST /agent/v1/heartbeat HTTP/1.1" 401'
        assert poll(lambda: platform.log_count(refused), timeout=5, interval=0.05) == 1
        assert platform.log_count('"POST /agent/v1/connect HTTP/1.1" 200') == 1
        assert platform.log_count('"POST /agent/v1/heartbeat HTTP/1.1" 200') == 0


def test_after_redis_loses_its_data_the_next_beat_finds_the_agent_again(
    agents: httpx.Client,
) -> None:
    # Given a connected agent, when Redis loses every key (restart, flush, failover)
    worker, agent = worker_with_key()
    post(agents, "connect", agent, {"worker": worker.public_id, "hostname": "node7"})
    redis_client().flushdb()
    # Then its next beats go to the database once, are accepted, and it is alive again
    beats = [post(agents, "heartbeat", agent, {"worker": worker.public_id}) for _ in range(3)]

    assert [b.status_code for b in beats] == [200, 200, 200]
    assert Liveness().alive([worker.pk]) == {worker.pk}


def test_a_beat_carrying_activity_stores_it_in_the_same_round_trip(agents: httpx.Client) -> None:
    worker, agent = worker_with_key()
    connect = {"worker": worker.public_id, "hostname": "node7", "job_id": "123"}
    assert post(agents, "connect", agent, connect).status_code == 200
    # A quiet span for the job, a busy one for one session launcher, a quiet one for another.
    report = {"span": "10.0", "cpu": "0.10", "io": "512", "sessions": "sbusy:9.00:0,squiet:0:0"}
    beat = post(agents, "heartbeat", agent, {"worker": worker.public_id, **report})
    assert (beat.status_code, beat.response.json(), beat.signed) == (200, {"status": "ok"}, True)
    stored = redis_client().get(f"{ACTIVITY_PREFIX}{worker.pk}:r")
    assert stored is not None and stored.decode().endswith(";0.010;51")
    sessions = idle.session_quiet_since(worker.pk, ["sbusy", "squiet", "snever"])
    assert sessions["sbusy"] is not None and sessions["squiet"] is not None
    assert sessions["snever"] is None
    # A malformed report costs the beat nothing; the answer says why it was left out.
    redis_client().delete(f"{PREFIX}{worker.pk}")
    bad = post(agents, "heartbeat", agent, {"worker": worker.public_id, "span": "-1"})
    assert (bad.status_code, bad.signed) == (200, True)
    assert bad.response.json()["activity_error"].startswith("span:")
    assert Liveness().alive([worker.pk]) == {worker.pk}

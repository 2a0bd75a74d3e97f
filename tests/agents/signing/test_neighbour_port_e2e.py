"""A neighbour on the agent's way (holding the relay's port, or reading the plain HTTP between
node and login host) gets nothing: on the real Slurm, with a real job's agent.

The job is told the address of a small front of the test's own, which passes agent calls to the
agents' server, can answer in their place as a neighbour who took the port would, and keeps a
copy of what crossed it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import AbstractUser

from harness.agents import agent_pids, freeze_agent, thaw
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from workers_app.actions import requests
from workers_app.liveness import PREFIX, Liveness
from workers_app.models import Environment, EnvironmentField, Worker, WorkerEvent
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]
# Room for the neighbour's turn: the platform would rightly stop an agent silent this long.
KNOBS = {"ACTIVATE_HEARTBEAT_TIMEOUT": "30"}
TIMEOUT_MS = int(KNOBS["ACTIVATE_HEARTBEAT_TIMEOUT"]) * 1000
# What the heartbeat sweep logs once it has given every connected worker a fresh grace period
# because it found the store without its epoch (this test's fresh Redis).
RESET_GRACE = "heartbeat store was reset"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Front:
    """Where the job's agent calls: passes calls on, or answers 403 itself as a neighbour."""

    upstream: str = ""
    neighbour: bool = False
    seen: list[Seen] = field(default_factory=list)
    refused: int = 0
    in_flight: int = 0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # The sweep's ping always gets through: silence stays audible.
                self._pass(b"")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if front.neighbour:
                    front.refused += 1
                    self._answer(403, {"content-type": "application/json"}, b'{"error": "no"}')
                    return
                front.in_flight += 1
                try:
                    self._pass(body)
                finally:
                    front.in_flight -= 1
                # Noted once the platform has answered it: nothing of it is still on the way
                # when a test acts on what was seen.
                front.seen.append(Seen("POST", self.path, dict(self.headers.items()), body))

            def _pass(self, body: bytes) -> None:
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type")
                }
                answer = httpx.request(
                    self.command,
                    front.upstream + self.path,
                    content=body or None,
                    headers=headers,
                    timeout=10,
                )
                self._answer(answer.status_code, dict(answer.headers.items()), answer.content)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name in ("content-type", "x-activate-signature"):
                    if name in headers:
                        self.send_header(name, headers[name])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class PlatformBehindFront(Platform):
    """The platform, its jobs told the front's address instead of the agents' server's."""

    front_url: str = ""

    def env(self) -> dict[str, str]:
        environ = super().env()
        environ["ACTIVATE_AGENT_URL"] = self.front_url
        return environ


@pytest.fixture
def front() -> Iterator[Front]:
    front = Front()
    front.start()
    yield front
    front.stop()


@pytest.fixture
def platform(transactional_db: None, tmp_path: Path, front: Front) -> Iterator[Platform]:
    platform = PlatformBehindFront(workdir=tmp_path, knobs=KNOBS, front_url=front.url)
    front.upstream = platform.agent_url
    with platform.running() as running:
        yield running


@pytest.fixture
def environment(make_cluster, ssh_target: SshTarget) -> Environment:
    environment = Environment.objects.create(
        cluster=make_cluster(), name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    return environment


def connected_worker(user: AbstractUser, environment: Environment) -> Worker:
    worker = requests.request_worker(
        owner=user,  # type: ignore[arg-type]
        cluster=environment.cluster.name,
        environment=environment.name,
    )
    wait_for(
        lambda: (
            Worker.objects.get(pk=worker.pk).status == S.CONNECTED and agent_pids(worker.public_id)
        ),
        timeout=90,
    )
    worker.refresh_from_db()
    return worker


def test_an_unsigned_403_from_a_neighbour_on_the_way_is_retried_and_the_worker_stays(
    platform: Platform, front: Front, user: AbstractUser, environment: Environment
) -> None:
    # Given a connected worker whose agent beats through the front
    worker = connected_worker(user, environment)
    pids = agent_pids(worker.public_id)
    events = WorkerEvent.objects.filter(worker=worker).count()
    wait_for(lambda: any(s.path == "/agent/v1/heartbeat" for s in front.seen), timeout=10)

    # When a neighbour holds the way and answers every agent call 403, unsigned
    front.neighbour = True
    wait_for(lambda: front.refused >= 3, timeout=20)
    front.neighbour = False
    beats = len(front.seen)

    # Then the agent kept running and beats again through the front, and the worker never
    # changed status
    wait_for(lambda: len(front.seen) >= beats + 2, timeout=20)
    assert agent_pids(worker.public_id) == pids
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED
    assert WorkerEvent.objects.filter(worker=worker).count() == events
    assert "Bearer" not in "".join(s.headers.get("Authorization", "") for s in front.seen)


def test_a_captured_beat_replayed_to_the_platform_is_refused_and_changes_nothing(
    platform: Platform, front: Front, user: AbstractUser, environment: Environment
) -> None:
    # Given a beat of a real agent, as a neighbour reading the wire kept it
    worker = connected_worker(user, environment)
    captured = wait_for(
        lambda: next((s for s in front.seen if s.path == "/agent/v1/heartbeat"), None),
        timeout=10,
    )
    events = WorkerEvent.objects.filter(worker=worker).count()
    frozen = freeze_agent(worker.public_id)
    store, key = Liveness(), f"{PREFIX}{worker.pk}"
    try:
        # A beat sent just before the freeze must land first. The sweeper's first sweep on this
        # test's fresh Redis writes the heartbeat epoch, then sets every connected worker's key
        # anew (a fresh grace, as an accepted replay would: CI saw it 7 s late): both are over.
        wait_for(lambda: front.in_flight == 0, timeout=10)
        wait_for(store.intact, timeout=30)
        wait_for(lambda: platform.log_count(RESET_GRACE) >= 1, timeout=30)
        # The key is left in place (a sweep finds nobody silent) and has run down a while, so
        # that a replay setting it anew would stand out.
        wait_for(lambda: 0 < store.redis.pttl(key) <= TIMEOUT_MS - 1500, timeout=10)
        before = store.redis.pttl(key)
        # When the neighbour sends it to the agents' server again
        again = httpx.post(
            platform.agent_url + captured.path,
            content=captured.body,
            headers={k: v for k, v in captured.headers.items() if k.lower() != "host"},
            timeout=10,
        )
        after = store.redis.pttl(key)
        # Then it is refused, unsigned, and gives nobody more time: the key only ran down
        assert again.status_code == 401, again.text
        assert "x-activate-signature" not in again.headers
        assert 0 < after <= before, (before, after)
    finally:
        thaw(frozen)
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED
    assert WorkerEvent.objects.filter(worker=worker).count() == events

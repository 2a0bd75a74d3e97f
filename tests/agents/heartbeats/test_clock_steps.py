"""Clocks: agents' times are judged by Redis's clock, one for every host of the platform; a request
refused for its time alone gets a signed 425 carrying that clock, on which the agent re-bases and
signs again at once; replay protection is as it was (a captured beat sent again, or re-timed, is
refused and keeps nobody alive); the agent never moves its clock on an unsigned answer; and
liveness is Redis's TTLs, which a step of a platform host's clock does not expire. Against the
real agents' server (`scripts/start.sh agents`) where the behaviour lives in it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from core.redis_connection import redis_client
from harness.clocks import LIBFAKETIME
from harness.platform import Platform
from node import activate_agent
from tests.agents.heartbeats.signed import worker_with_key
from tests.agents.heartbeats.test_sweeps import connected_worker
from workers_app import sweeps
from workers_app.liveness import PREFIX, Liveness
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

BEAT = "/agent/v1/heartbeat"
STEP = 600.0
WINDOW = 2  # ACTIVATE_AGENT_SIGNATURE_WINDOW of these tests' server, seconds


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """An agents' server whose window is 2 s, and whose host's clock is 10 minutes ahead
    (libfaketime, for all its processes: a constant offset on both clocks)."""
    knobs = {
        "ACTIVATE_AGENT_SIGNATURE_WINDOW": str(WINDOW),
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": "+10m",
    }
    platform = Platform(workdir=tmp_path_factory.mktemp("agents"), knobs=knobs)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


def connected(server: Platform) -> activate_agent.Platform:
    """The agent's signed calls (its Platform), its worker connected."""
    worker, signed = worker_with_key()
    agent = activate_agent.Platform(
        server.agent_url, worker.public_id, signed.key_id, signed.key, timeout=5
    )
    agent.post("/agent/v1/connect", {"worker": worker.public_id, "hostname": "node7"})
    return agent


@pytest.mark.django_db(transaction=True)
def test_a_platform_host_ten_minutes_ahead_accepts_beats_on_redis_time(server: Platform) -> None:
    # Given an agents' server whose host's clock is 10 minutes ahead, and an agent on true time
    agent = connected(server)
    assert abs(agent.clock.now() - time.time()) < 1  # re-based on the connect: Redis's time
    # When it beats, then every beat is accepted as it is signed: none re-timed
    for _ in range(5):
        assert agent.post(BEAT, {"worker": agent.worker}) == {"status": "ok"}
    assert agent.answered_ts == agent.last_ts
    assert abs(agent.clock.now() - time.time()) < 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", [STEP, -STEP])
def test_an_agent_whose_clock_is_ten_minutes_off_re_bases_and_its_beat_is_taken_at_once(
    server: Platform, step: float
) -> None:
    # Given a connected agent whose clock is then 10 minutes off
    agent = connected(server)
    agent.clock.base += step
    pk = Worker.objects.get(public_id=agent.worker).pk
    redis_client().delete(f"{PREFIX}{pk}")
    # When it beats, then that one call is taken: 10 minutes ahead, refused for its time,
    # re-based and sent again; 10 minutes behind, timed just after its last call (its times
    # only go up), until that is outside the window too
    assert agent.post(BEAT, {"worker": agent.worker}) == {"status": "ok"}
    assert Liveness().alive([pk]) == {pk}
    if step < 0:
        time.sleep(WINDOW + 0.5)
        assert agent.post(BEAT, {"worker": agent.worker}) == {"status": "ok"}
    assert abs(agent.clock.now() - time.time()) < 1
    # and the next are taken as they are
    sent = agent.connection.opened
    assert agent.post(BEAT, {"worker": agent.worker}) == {"status": "ok"}
    assert agent.connection.opened == sent


@pytest.mark.django_db(transaction=True)
def test_a_captured_beat_sent_again_or_re_timed_keeps_nobody_alive(server: Platform) -> None:
    # Given a beat as it crossed the wire (a neighbour on the way kept a copy), taken
    worker, agent = worker_with_key()
    with httpx.Client(base_url=server.agent_url, timeout=10) as client:
        connect = {"worker": worker.public_id, "hostname": "node7"}
        assert agent.post(client, "/agent/v1/connect", connect).status_code == 200
        body = json.dumps({"worker": worker.public_id}).encode()
        signed_at = redis_client().time()[0] + 1
        header, nonce = agent.signed(BEAT, body, ts=f"{signed_at}.000000")
        captured = {"Authorization": header, "Content-Type": "application/json"}
        assert client.post(BEAT, content=body, headers=captured).status_code == 200
        redis_client().delete(f"{PREFIX}{worker.pk}")
        # When it is sent again within the window: refused, unsigned
        again = client.post(BEAT, content=body, headers=captured)
        assert again.status_code == 401 and "x-activate-signature" not in again.headers
        # re-timed to now (its signature is then another request's): refused, unsigned
        now = f"ts={redis_client().time()[0] + 2}.000000,"
        retimed = {**captured, "Authorization": header.replace(header.split()[3], now)}
        forged = client.post(BEAT, content=body, headers=retimed)
        assert (forged.status_code, forged.json()) == (401, {"error": "bad signature"})
        # and sent again once the window has passed: told the time (signed for that old nonce,
        # no use to anyone but its agent), nothing done
        while redis_client().time()[0] <= signed_at + WINDOW:
            time.sleep(0.1)
        late = client.post(BEAT, content=body, headers=captured)
        assert late.status_code == 425
        signature = late.headers[activate_agent.SIGNATURE_HEADER]
        assert activate_agent.verified(agent.key, 425, nonce, late.content, signature)
    # Then the worker was kept alive by none of them
    assert Liveness().alive([worker.pk]) == set()


class Forger(BaseHTTPRequestHandler):
    """Answers every call 425 with a time 10 minutes ahead: unsigned, or signed for another
    nonce (a platform's answer captured on the way and played back)."""

    key = ""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"server_time": f"{time.time() + STEP:.6f}"}).encode()
        self.send_response(425)
        self.send_header("Content-Length", str(len(body)))
        if self.key:
            other = activate_agent.new_nonce()
            signature = activate_agent.answer_signature(self.key, 425, other, body)
            self.send_header(activate_agent.SIGNATURE_HEADER, signature)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("signed_for_another_nonce", [False, True])
def test_a_forged_time_never_moves_the_agents_clock(signed_for_another_nonce: bool) -> None:
    key = "k" * 43
    handler = type("Handler", (Forger,), {"key": key if signed_for_another_nonce else ""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        agent = activate_agent.Platform(url, "wabc", "i" * 22, key, timeout=5)
        with pytest.raises(activate_agent.Unverified):
            agent.post(BEAT, {"worker": "wabc"})
        assert abs(agent.clock.now() - time.time()) < 1
    finally:
        server.shutdown()
        server.server_close()


def test_the_agents_clock_does_not_follow_a_step_of_the_nodes_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = activate_agent.Clock()
    before = clock.now()
    real = time.time
    for step in (STEP, -STEP):
        monkeypatch.setattr(activate_agent.time, "time", lambda step=step: real() + step)
        assert 0 <= clock.now() - before < 1
    # while the platform's signed time does move it
    clock.rebase(real() + 30)
    assert 29 < clock.now() - real() < 31


@pytest.mark.django_db
@pytest.mark.parametrize("step", [STEP, -STEP])
def test_a_step_of_the_sweepers_clock_stops_no_worker_whose_beat_is_alive(
    tmp_path: Path, step: float
) -> None:
    # Given connected workers whose beats are alive in Redis (a TTL, Redis's clock)
    Liveness().claim_reset()
    workers = [connected_worker() for _ in range(3)]
    assert sweeps.sweep_heartbeats() == 0
    # When the sweeping host's clock steps 10 minutes, then nobody is stopped: what is alive is
    # Redis's to say
    assert sweeps.sweep_heartbeats(now=time.time() + step) == 0
    assert sweeps.sweep_heartbeats(now=time.time() + step + 1) == 0
    assert all(Worker.objects.get(pk=w.pk).status == WorkerStatus.CONNECTED for w in workers)
    # while one whose key expired (by Redis's TTL) is
    Liveness().forget(workers[0].pk)
    assert sweeps.sweep_heartbeats(now=time.time() + step + 2) == 1

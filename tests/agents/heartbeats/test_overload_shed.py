"""Overload shed, not collapse: the real agents' server (`scripts/start.sh agents`) with room
for one beat at a time, flooded with signed beats, sheds what it has no room for (a signed 503
saying when to retry, nothing done), notes it in Redis, the node agent's own code waits as told,
and the heartbeat sweep stops nobody for a beat the platform refused, but does stop a worker
that was silent on its own once the shed window is over. Real processes, Redis and PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from harness.agents import SignedAgent
from harness.platform import Platform
from harness.waiting import poll
from node import activate_agent
from tests.agents.heartbeats.signed import worker_with_key
from workers_app import sweeps
from workers_app.liveness import Liveness, ShedRecord
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db(transaction=True)
BEAT = "/agent/v1/heartbeat"
# Room for one beat at a time; a shed window (the heartbeat timeout) the test can wait out.
KNOBS = {
    "ACTIVATE_AGENT_BEATS_IN_FLIGHT": "1",
    "ACTIVATE_AGENT_RETRY_AFTER_MAX": "3",
    "ACTIVATE_HEARTBEAT_INTERVAL": "1",
    "ACTIVATE_HEARTBEAT_TIMEOUT": "5",
}
FLOODERS = 12


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path_factory.mktemp("shed"), knobs=KNOBS)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


@dataclass
class Flood:
    """Signed beats from several agents at once, as fast as the server answers, each agent on a
    kept connection of its own; what each beat was answered."""

    url: str
    agents: list[SignedAgent]
    stop: threading.Event = field(default_factory=threading.Event)
    answers: Counter[tuple[int, bool]] = field(default_factory=Counter)
    delays: list[float] = field(default_factory=list)
    retry_headers: set[str] = field(default_factory=set)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Flood:
        for agent in self.agents:
            self.threads.append(threading.Thread(target=self._beat, args=(agent,), daemon=True))
            self.threads[-1].start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def _beat(self, agent: SignedAgent) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.is_set():
                answer = agent.post(client, BEAT)
                self.answers[(answer.status_code, answer.signed)] += 1
                if answer.status_code == 503:
                    self.delays.append(float(answer.response.json()["retry_after"]))
                    self.retry_headers.add(answer.response.headers.get("retry-after", ""))

    def shed(self) -> int:
        return self.answers[(503, True)]


def connected(server: Platform, count: int) -> list[tuple[Worker, SignedAgent]]:
    made = [worker_with_key() for _ in range(count)]
    with httpx.Client(base_url=server.agent_url, timeout=10) as client:
        for worker, agent in made:
            body = {"worker": worker.public_id, "hostname": "node7", "job_id": "123"}
            assert agent.post(client, "/agent/v1/connect", body).status_code == 200
    return made


def beat_until_taken(server: Platform, agent: SignedAgent) -> None:
    """Beat as an agent does, waiting as told while shed."""
    with httpx.Client(base_url=server.agent_url, timeout=10) as client:
        for _ in range(20):
            answer = agent.post(client, BEAT)
            if answer.status_code == 200:
                return
            assert (answer.status_code, answer.signed) == (503, True)
            time.sleep(float(answer.response.json()["retry_after"]))
    raise AssertionError("never taken")


def test_a_flooded_server_sheds_with_a_signed_retry_after_and_notes_what_it_shed(
    server: Platform,
) -> None:
    # Given twelve connected agents beating at once, as fast as they are answered (and no note
    # of an earlier test's flood still to come)
    flooders = [agent for _, agent in connected(server, FLOODERS)]
    time.sleep(1.5)
    record = ShedRecord()
    record.redis.delete(record.key, record.total_key)
    # When the server, with room for one beat at a time, is flooded for two seconds
    with Flood(server.agent_url, flooders) as flood:
        time.sleep(2)
    # Then it takes some and sheds the others, every answer signed for its own request
    assert flood.answers[(200, True)] > 0 and flood.shed() > 0, flood.answers
    assert set(flood.answers) == {(200, True), (503, True)}, flood.answers
    # telling each when to retry, at least a second and at most the most configured, jittered,
    # the header rounded up for other clients
    assert 1.0 <= min(flood.delays) and max(flood.delays) <= 3.0
    assert len(set(flood.delays)) > 1
    assert flood.retry_headers <= {"1", "2", "3"}
    # and notes in Redis, within a second, every beat it shed, for a heartbeat timeout
    assert poll(lambda: record.window()[0] == flood.shed(), timeout=3, interval=0.1)
    assert record.total() == flood.shed()
    ttl = record.redis.pttl(record.key)
    assert 3000 < ttl <= 5000
    # not one access log line a shed beat, but the gate's count once a second
    assert server.log_count('"POST /agent/v1/heartbeat HTTP/1.1" 503') == 0
    assert server.log_count("beats since the last note") >= 1


def test_a_shed_beat_does_nothing(server: Platform) -> None:
    # Given a connected agent whose liveness key is gone, and a flood
    [(worker, agent)] = connected(server, 1)
    flooders = [agent for _, agent in connected(server, FLOODERS)]
    with Flood(server.agent_url, flooders), httpx.Client(base_url=server.agent_url) as client:
        time.sleep(0.2)
        for _ in range(200):
            Liveness().forget(worker.pk)
            answer = agent.post(client, BEAT)
            if answer.status_code == 503:
                break
    # When its beat is shed, then it kept nothing alive
    assert (answer.status_code, answer.signed) == (503, True)
    assert Liveness().alive([worker.pk]) == set()


def test_the_node_agents_own_code_waits_as_told_and_stays_connected(
    server: Platform,
) -> None:
    # Given the node agent's Platform and Agent, connected through the real server
    worker, signed = worker_with_key()
    platform = activate_agent.Platform(
        server.agent_url, worker.public_id, signed.key_id, signed.key, timeout=5
    )
    agent = activate_agent.Agent(platform, {"worker": worker.public_id, "hostname": "node7"}, 1.0)
    statuses: list[tuple[int, bytes]] = []
    send = platform.connection.send

    def watched(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        status, answer, signature = send(path, body, headers)
        statuses.append((status, answer))
        return status, answer, signature

    platform.connection.send = watched  # type: ignore[method-assign]
    assert agent.beat() == 1.0 and agent.connected
    retry_delay = agent.retry_delay
    flooders = [a for _, a in connected(server, FLOODERS)]
    # When it beats in a flood until it is shed
    with Flood(server.agent_url, flooders):
        for _ in range(300):
            delay = agent.beat()
            if statuses[-1][0] == 503:
                break
    # Then it waits what the signed answer said plus up to half again, still connected, and
    # not as after a failure
    status, answer = statuses[-1]
    assert status == 503, statuses[-3:]
    told = float(json.loads(answer)["retry_after"])
    assert told <= delay <= 1.5 * told, (told, delay)
    assert agent.connected and agent.retry_delay == retry_delay
    # and its next beat, the flood over, is taken
    assert agent.beat() == 1.0 and statuses[-1][0] == 200


def test_the_sweep_stops_nobody_for_a_shed_beat_and_the_silent_one_once_the_window_is_over(
    server: Platform,
) -> None:
    Liveness().claim_reset()
    # Given two connected agents: one whose beat the flooded server shed, one that went silent
    (shed_worker, shed_agent), (silent_worker, _) = connected(server, 2)
    flooding = connected(server, FLOODERS)
    flooders = [agent for _, agent in flooding]
    with Flood(server.agent_url, flooders), httpx.Client(base_url=server.agent_url) as client:
        time.sleep(0.2)
        shed = None
        for _ in range(200):
            shed = shed_agent.post(client, BEAT)
            if shed.status_code == 503:
                break
    assert shed is not None and (shed.status_code, shed.signed) == (503, True)
    assert poll(ShedRecord().shed_lately, timeout=3, interval=0.1)
    # Both liveness keys have run out: the one backing off, the silent one
    Liveness().forget(shed_worker.pk)
    Liveness().forget(silent_worker.pk)
    # When the sweep runs within the shed window, then it stops neither
    assert sweeps.sweep_heartbeats() == 0
    assert statuses(shed_worker, silent_worker) == [S.CONNECTED, S.CONNECTED]
    # The shed agent beats again after its delay; the window ends a heartbeat timeout after the
    # last shed; then the sweep stops the silent one only
    beat_until_taken(server, shed_agent)
    assert poll(lambda: not ShedRecord().shed_lately(), timeout=8, interval=0.2)
    beat_until_taken(server, shed_agent)
    Liveness().beat_many(w.pk for w, _ in flooding)  # they beat on, out of the test's way
    sweeps.sweep_heartbeats()
    assert statuses(shed_worker, silent_worker) == [S.CONNECTED, S.STOPPED]


def statuses(*workers: Worker) -> list[str]:
    return [Worker.objects.get(pk=w.pk).status for w in workers]

"""A node's clock stepped: the real agent (node/activate_agent.py in its own process) against the
real agents' server (`scripts/start.sh agents`), its clock stepped 10 minutes forward and back
while it beats, or 10 minutes off when it starts. The worker stays connected: its liveness key
never lapses and every beat but the one re-timed after a step is accepted.

The step is made in the agent's process only. A wall clock step (NTP, an operator) moves the
realtime clock and never the monotonic one; libfaketime (Debian's faketime) cannot keep the
monotonic clock real on this Python (its clock_nanosleep then fails with EINVAL), so steps
while the agent runs are made by a bootstrap whose time.time() adds the offset read from a file
at each call. An agent that starts on a clock already 10 minutes off runs under libfaketime
itself (a constant offset on both clocks).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.platform import Platform
from node import activate_agent
from tests.agents.heartbeats.signed import worker_with_key
from tests.node.test_kept_connections import beats_answered
from workers_app.liveness import Liveness
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)
AGENT = Path(activate_agent.__file__)
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
STEP = 600.0
# Each clock held this long: past the heartbeat timeout (6 s in the tests' knobs).
HOLD = 8.0

# time.time() as the node's wall clock with the offset the file says: the monotonic clock
# (the agent's sleeps, its clock between answers) is left alone, as a step leaves it.
STEPPED_CLOCK = """
import os, runpy, sys, time
real, path = time.time, os.environ["STEP_FILE"]
def stepped():
    with open(path) as handle:
        return real() + float(handle.read() or 0)
time.time = stepped
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class RunningAgent:
    process: subprocess.Popen[bytes]
    worker: Worker
    log: Path
    step_file: Path

    def step_to(self, offset: float) -> None:
        self.step_file.write_text(repr(offset))


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


def start_agent(
    platform: Platform, tmp_path: Path, *, offset: float = 0.0, faketime: str = ""
) -> RunningAgent:
    """The agent as a job script starts it, on a node clock ``offset`` seconds off (steppable
    while it runs), or under libfaketime's ``faketime`` offset."""
    worker, signed = worker_with_key()
    step_file = tmp_path / "clock-offset"
    step_file.write_text(repr(offset))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")},
        "ACTIVATE_URL": platform.agent_url,
        "ACTIVATE_WORKER_ID": worker.public_id,
        "ACTIVATE_AGENT_KEY_ID": signed.key_id,
        "ACTIVATE_AGENT_KEY": signed.key,
        "ACTIVATE_HEARTBEAT_INTERVAL": "1",
        "STEP_FILE": str(step_file),
    }
    argv = [sys.executable, "-c", STEPPED_CLOCK, str(AGENT)]
    if faketime:
        env.update({"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": faketime})
        argv = [sys.executable, str(AGENT)]
    log = tmp_path / "agent.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return RunningAgent(process, worker, log, step_file)


def status(worker: Worker) -> str:
    return str(Worker.objects.values_list("status", flat=True).get(pk=worker.pk))


def wait_connected(agent: RunningAgent, within: float = 15.0) -> float:
    """Seconds until the worker is connected (AssertionError with the agent's log if not)."""
    started = time.monotonic()
    while status(agent.worker) != WorkerStatus.CONNECTED:
        assert agent.process.poll() is None, agent.log.read_text()
        assert time.monotonic() - started < within, agent.log.read_text()
        time.sleep(0.1)
    return time.monotonic() - started


def lapses_while(agent: RunningAgent, seconds: float) -> int:
    """How many times in ``seconds`` (looked at every 0.1 s) the worker's liveness key was
    found missing or the worker no longer connected."""
    store = Liveness()
    lapses = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not store.alive([agent.worker.pk]) or status(agent.worker) != WorkerStatus.CONNECTED:
            lapses += 1
        time.sleep(0.1)
    return lapses


def stop(agent: RunningAgent) -> str:
    agent.process.terminate()
    agent.process.wait(10)
    return agent.log.read_text()


@pytest.fixture
def agents() -> Iterator[list[RunningAgent]]:
    started: list[RunningAgent] = []
    yield started
    for agent in started:
        if agent.process.poll() is None:
            agent.process.kill()
            agent.process.wait()


def test_a_worker_stays_connected_while_its_nodes_clock_steps_ten_minutes_forward_and_back(
    platform: Platform, tmp_path: Path, agents: list[RunningAgent]
) -> None:
    # Given the real agent, connected and beating every second
    agent = start_agent(platform, tmp_path)
    agents.append(agent)
    wait_connected(agent)
    assert lapses_while(agent, 2.0) == 0
    # When its node's clock steps 10 minutes forward, back, and 10 minutes back again, each
    # held past the heartbeat timeout
    lapses = {}
    for offset in (STEP, 0.0, -STEP):
        agent.step_to(offset)
        lapses[offset] = lapses_while(agent, HOLD)
    # Then its liveness key never lapsed, it was never stopped, and no beat was refused
    assert lapses == {STEP: 0, 0.0: 0, -STEP: 0}, agent.log.read_text()
    received, refused = beats_answered(platform)
    assert refused == 0 and received >= 3 * HOLD - 3, (received, refused)
    assert agent.process.poll() is None
    assert "re-based" not in stop(agent)


@pytest.mark.parametrize("ahead", ["+10m", "-10m"])
def test_an_agent_started_on_a_clock_ten_minutes_off_connects_and_beats_on_the_platforms_time(
    platform: Platform, tmp_path: Path, agents: list[RunningAgent], ahead: str
) -> None:
    # Given a node whose clock is 10 minutes off (both its clocks, under libfaketime)
    agent = start_agent(platform, tmp_path, faketime=ahead)
    agents.append(agent)
    # When its agent starts: its first call is refused for its time (a signed 425 with the
    # platform's), re-based, and sent again at once
    assert wait_connected(agent) < 5
    # Then it beats on the platform's time: never lapsing, nothing refused again
    assert lapses_while(agent, HOLD) == 0
    received, _refused = beats_answered(platform)
    assert received >= HOLD - 2
    log = stop(agent)
    assert log.count("re-based") == 1, log

"""A node's clock stepped: the real agent (node/activate_agent.py in its own process) against the
real agents' server (`scripts/start.sh agents`), its clock stepped 10 minutes forward and back
while it beats, or 10 minutes off when it starts. The worker stays connected: its liveness key
never lapses and every beat but the one re-timed after a step is accepted.

The step is made in the agent's process only (harness/clocks.py says how); `python -m drills
clock_step` steps the agents of real jobs beside the whole platform.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.clocks import StepFile, beats_answered, start_agent, watch
from harness.platform import Platform
from tests.agents.heartbeats.signed import worker_with_key
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)
STEP = 600.0
# Each clock held this long: past the heartbeat timeout (6 s in the tests' knobs).
HOLD = 8.0


@dataclass
class RunningAgent:
    process: subprocess.Popen[bytes]
    worker: Worker
    log: Path
    clock: StepFile

    def step_to(self, offset: float) -> None:
        self.clock.step_to(offset)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


def start_stepped_agent(platform: Platform, tmp_path: Path, *, faketime: str = "") -> RunningAgent:
    """The agent as a job script starts it, on a node clock steppable while it runs (at 0), or
    under libfaketime's ``faketime`` offset."""
    worker, signed = worker_with_key()
    clock = StepFile(tmp_path / "clock-offset")
    clock.step_to(0.0)
    log = tmp_path / "agent.log"
    process = start_agent(
        platform.agent_url, signed, log, clock=None if faketime else clock, faketime=faketime
    )
    return RunningAgent(process, worker, log, clock)


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
    return watch([agent.worker.pk], seconds).lapses[agent.worker.pk]


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
    agent = start_stepped_agent(platform, tmp_path)
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
    answered = beats_answered(platform.workdir / "metrics")
    assert not answered.refused and answered.received >= 3 * HOLD - 3, answered
    assert agent.process.poll() is None
    assert "re-based" not in stop(agent)


@pytest.mark.parametrize("ahead", ["+10m", "-10m"])
def test_an_agent_started_on_a_clock_ten_minutes_off_connects_and_beats_on_the_platforms_time(
    platform: Platform, tmp_path: Path, agents: list[RunningAgent], ahead: str
) -> None:
    # Given a node whose clock is 10 minutes off (both its clocks, under libfaketime)
    agent = start_stepped_agent(platform, tmp_path, faketime=ahead)
    agents.append(agent)
    # When its agent starts: its first call is refused for its time (a signed 425 with the
    # platform's), re-based, and sent again at once
    assert wait_connected(agent) < 5
    # Then it beats on the platform's time: never lapsing, nothing refused again
    assert lapses_while(agent, HOLD) == 0
    assert beats_answered(platform.workdir / "metrics").received >= HOLD - 2
    log = stop(agent)
    assert log.count("re-based") == 1, log

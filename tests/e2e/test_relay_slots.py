"""No slot a neighbour can hold: another Unix user of the login host (``pwbob``, never root)
holds 600 connections to the relay, a byte every 5 s on each and every closed one opened again
within a second, for three heartbeat timeouts. The owner's relayed worker keeps beating through
the relay, stays connected and keeps its job. Real Slurm over real SSH, the real relay kept by
`run_relays`, the agents' server on an address the job is never told (as in test_relay.py).
"""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.agents import freeze_agent, thaw
from harness.cluster import SshTarget, squeue_names
from harness.platform import FAST_KNOBS, Platform
from harness.waiting import wait_for
from tests.e2e.test_relay import HIDDEN_AGENTS_HOST, relay_row, statuses, wait_relay_up
from workers_app.actions import deletion, requests
from workers_app.models import AgentRoute, Environment, EnvironmentField, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]

NEIGHBOUR = "pwbob"
NODE_PYTHON = "/usr/bin/python3"
HEARTBEAT_INTERVAL = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_INTERVAL"])
HEARTBEAT_TIMEOUT = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_TIMEOUT"])
HOLD = 3 * HEARTBEAT_TIMEOUT
KNOBS = {"ACTIVATE_RELAY_LEASE": "2", "ACTIVATE_RELAY_CHECK_INTERVAL": "0.5"}
# The longest an agent beating every second may go without a call accepted: a beat refused and
# its retry (the agent waits at most an interval between them) with time to spare.
BEAT_GAP_ALLOWED = 3 * HEARTBEAT_INTERVAL + 1

# Holds COUNT connections to host:port: a byte (never a line's end) on each every EVERY seconds,
# and any connection found closed opened again at the next tick (a second). Raises its own limit
# on open files to the hard limit first (an ordinary user may). Prints what it did as it goes.
HOLD_SLOTS = """
    import resource, select, socket, sys, time
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    every, seconds = float(sys.argv[4]), float(sys.argv[5])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < count + 32:
        count = hard - 32
    print("NOFILE soft %d hard %d, holding %d" % (soft, hard, count), flush=True)
    payload = b"GET /agent/v1/ping?" + b"a" * 400
    held = {}  # socket -> [bytes sent, when the last byte went]
    opened = closed = failed = 0

    def open_one():
        global opened, failed
        try:
            conn = socket.create_connection((host, port), timeout=2)
        except OSError:
            failed += 1
            return
        conn.setblocking(False)
        held[conn] = [0, 0.0]
        opened += 1

    def drop(conn):
        global closed
        held.pop(conn, None)
        conn.close()
        closed += 1

    until = time.monotonic() + seconds
    while time.monotonic() < until:
        tick = time.monotonic()
        while len(held) < count and time.monotonic() < until:
            open_one()
        readable, _, _ = select.select(list(held), [], [], 0)
        for conn in readable:
            try:
                if not conn.recv(65536):
                    drop(conn)
            except OSError:
                drop(conn)
        now = time.monotonic()
        for conn, state in list(held.items()):
            if now - state[1] >= every:
                try:
                    conn.send(payload[state[0] % len(payload):][:1])
                    state[0] += 1
                    state[1] = now
                except OSError:
                    drop(conn)
        print("TICK held %d opened %d closed %d failed %d" % (len(held), opened, closed, failed),
              flush=True)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    print("DONE held %d opened %d closed %d failed %d" % (len(held), opened, closed, failed),
          flush=True)
"""


@dataclass
class Holder:
    """The neighbour's process holding connections, and what it printed."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def said(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(prefix)]

    def finish(self, timeout: float) -> None:
        self.process.wait(timeout=timeout)
        if self.reader is not None:
            self.reader.join(timeout=timeout)
        assert self.process.stderr is not None
        assert self.process.returncode == 0, self.process.stderr.read()


def hold_slots(host: str, port: int, count: int, *, every: float, seconds: float) -> Holder:
    """The neighbour starts holding ``count`` connections to host:port, as its own user."""
    code = textwrap.dedent(HOLD_SLOTS)
    args = [host, str(port), str(count), f"{every:g}", f"{seconds:g}"]
    process = subprocess.Popen(
        ["runuser", "-u", NEIGHBOUR, "--", NODE_PYTHON, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        start_new_session=True,
    )
    holder = Holder(process)
    holder.reader = threading.Thread(target=holder.read, daemon=True)
    holder.reader.start()
    return holder


@pytest.fixture
def slots_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path, knobs=KNOBS, agent_host=HIDDEN_AGENTS_HOST, relays=True)
    with platform.running() as running:
        yield running


@pytest.fixture
def relayed_environment(transactional_db: None, make_cluster, ssh_target: SshTarget) -> Environment:
    cluster = make_cluster(
        name="relay-slots", agent_route=AgentRoute.VIA_LOGIN_HOST, relay_host="127.0.0.1"
    )
    environment = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    return environment


def last_accepted_call(platform: Platform, worker: Worker) -> float:
    """When the platform last accepted a signed call of the worker's agent (its own time,
    kept to refuse replays), in seconds; 0 before any."""
    client = platform.redis_client()
    latest = 0.0
    for key in client.scan_iter(f"activate:agent-order:{worker.public_id}:*"):
        value = client.get(key)
        if value:
            latest = max(latest, int(value.split(b":")[0]) / 1e6)
    return latest


def how_it_ended(worker: Worker) -> str:
    worker.refresh_from_db()
    event = worker.events.order_by("-at", "-id").first()
    return f"{worker.status} / {event.reason if event else ''}"


# The gaps between accepted calls under the flood are measured: not beside other tests' load.
@pytest.mark.serial
def test_a_neighbour_holding_the_relays_connections_leaves_the_owners_worker_beating(
    slots_platform: Platform, relayed_environment: Environment, user, ssh_target: SshTarget
) -> None:
    platform = slots_platform
    cluster = relayed_environment.cluster
    wait_relay_up(relayed_environment, platform)
    relay = relay_row(relayed_environment)
    host, _, port = relay.address.rpartition(":")
    worker = requests.request_worker(
        owner=user, cluster=cluster.name, environment=relayed_environment.name
    )
    try:
        wait_for(lambda: statuses([worker]) == [S.CONNECTED], timeout=120, interval=0.1)
    except TimeoutError:
        pytest.fail(f"the worker stayed {statuses([worker])}\n{platform.logs()}")
    worker.refresh_from_db()
    job_id = worker.scheduler_job_id
    events_before = worker.events.count()

    # Given: the neighbour holds 600 connections to the relay, a byte every 5 s on each.
    holder = hold_slots(host, int(port), 600, every=5, seconds=HOLD + 4)
    wait_for(lambda: holder.said("TICK"), timeout=30, interval=0.1)
    held_at_start = holder.said("TICK")[0]

    # When: it keeps them for three heartbeat timeouts.
    started = time.monotonic()
    worst_gap = 0.0
    probes: list[float] = []
    first_change = ""
    next_probe = started
    shed_noted = ""
    while time.monotonic() - started < HOLD:
        shed_noted = shed_noted or relay_row(relayed_environment).last_error
        if statuses([worker]) != [S.CONNECTED] and not first_change:
            first_change = how_it_ended(worker)
        gap = time.time() - last_accepted_call(platform, worker)
        worst_gap = max(worst_gap, gap)
        if time.monotonic() >= next_probe:
            # What an agent of another account sees: the relay answers, through the forward.
            asked = time.monotonic()
            try:
                answer = httpx.get(f"http://{relay.address}/agent/v1/ping", timeout=10)
                probes.append(time.monotonic() - asked if answer.status_code == 200 else -1)
            except httpx.HTTPError:
                probes.append(-1)
            next_probe += 1
        time.sleep(0.25)
    holder.finish(timeout=30)
    summary = holder.said("DONE")

    # Then: the worker stayed connected, with its job, its agent's calls accepted all along.
    assert not first_change, f"the worker went {first_change} during the hold"
    assert statuses([worker]) == [S.CONNECTED], how_it_ended(worker)
    assert worker.events.count() == events_before, "the worker changed status"
    assert worker.job_name in squeue_names(ssh_target) and job_id
    assert worst_gap < BEAT_GAP_ALLOWED, f"no call of the agent accepted for {worst_gap:.1f}s"
    assert -1 not in probes, f"pings through the relay failed: {probes}"
    # And: the connections the relay made give way were reported to its keeper and recorded.
    assert "shed=" in shed_noted, shed_noted
    print(
        f"\nneighbour ({held_at_start}; {summary[0] if summary else '?'}) held the relay for "
        f"{HOLD:g}s (heartbeat timeout {HEARTBEAT_TIMEOUT:g}s): worker {statuses([worker])[0]}, "
        f"longest without an accepted agent call {worst_gap:.2f}s, {len(probes)} pings through "
        f"the relay answered in {min(probes):.3f} to {max(probes):.3f}s; recorded: "
        f"{shed_noted[:160]}"
    )
    deletion.delete_worker(worker)
    wait_for(lambda: statuses([worker]) == [S.STOPPED], timeout=60)
    wait_for(lambda: worker.job_name not in squeue_names(ssh_target), timeout=60)


def connected_worker(environment: Environment, owner, platform: Platform) -> Worker:
    worker = requests.request_worker(
        owner=owner, cluster=environment.cluster.name, environment=environment.name
    )
    try:
        wait_for(lambda: statuses([worker]) == [S.CONNECTED], timeout=120, interval=0.1)
    except TimeoutError:
        pytest.fail(f"the worker stayed {statuses([worker])}\n{platform.logs()}")
    return worker


def test_while_the_relay_sheds_calls_no_silence_counts_and_then_it_counts_again(
    slots_platform: Platform, relayed_environment: Environment, user, ssh_target: SshTarget
) -> None:
    platform = slots_platform
    wait_relay_up(relayed_environment, platform)
    relay = relay_row(relayed_environment)
    host, _, port = relay.address.rpartition(":")
    worker = connected_worker(relayed_environment, user, platform)
    # Given: the neighbour floods the relay, and the agent is silent for real (frozen): the
    # platform cannot tell its silence from a beat the relay shed.
    holder = hold_slots(host, int(port), 600, every=5, seconds=2 * HEARTBEAT_TIMEOUT)
    wait_for(lambda: holder.said("TICK"), timeout=30, interval=0.1)
    frozen = freeze_agent(worker.public_id)
    assert frozen
    try:
        # Then: while it sheds, the worker is not read as lost.
        while holder.process.poll() is None:
            assert statuses([worker]) == [S.CONNECTED], how_it_ended(worker)
            time.sleep(0.25)
        holder.finish(timeout=30)
        flood_over = time.monotonic()
        # When: the flood is over. Then: a whole heartbeat timeout later, silence counts again.
        wait_for(lambda: statuses([worker]) != [S.CONNECTED], timeout=4 * HEARTBEAT_TIMEOUT)
        lost_after = time.monotonic() - flood_over
        ended = how_it_ended(worker)
    finally:
        thaw(frozen)
    assert ended == f"{S.STOPPED} / Worker disconnected"
    assert HEARTBEAT_TIMEOUT - 1 < lost_after < 2 * HEARTBEAT_TIMEOUT, lost_after
    print(
        f"\nthe relay shed calls for {2 * HEARTBEAT_TIMEOUT:g}s with the agent frozen: the worker "
        f"stayed connected, and went {ended} {lost_after:.1f}s after the flood "
        f"ended (heartbeat timeout {HEARTBEAT_TIMEOUT:g}s)"
    )
    wait_for(lambda: worker.job_name not in squeue_names(ssh_target), timeout=60)

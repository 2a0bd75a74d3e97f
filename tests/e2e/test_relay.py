"""Agents that cannot reach the platform: via the login host, on the real Slurm over real SSH.

The agents' server listens on 127.0.0.7, an address the job script never names: agents are
given only the relay's address on the login host (this machine, 127.0.0.1), and every call they
make goes relay -> the login host's loopback -> the platform's SSH connection -> agents' server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.agents import agent_pids
from harness.cluster import SshTarget, squeue_names
from harness.platform import Platform
from harness.relays import relay_pids, sshd_session_of
from harness.waiting import wait_for
from workers_app import services
from workers_app.agents.relays import relay_tag
from workers_app.models import AgentRelay, AgentRoute, Environment, EnvironmentField, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]

HIDDEN_AGENTS_HOST = "127.0.0.7"
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 8.0
KNOBS = {
    "ACTIVATE_HEARTBEAT_INTERVAL": f"{HEARTBEAT_INTERVAL:g}",
    "ACTIVATE_HEARTBEAT_TIMEOUT": f"{HEARTBEAT_TIMEOUT:g}",
    "ACTIVATE_RELAY_LEASE": "2",
    "ACTIVATE_RELAY_CHECK_INTERVAL": "0.5",
}


@pytest.fixture
def relay_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path, knobs=KNOBS, agent_host=HIDDEN_AGENTS_HOST, relays=True)
    with platform.running() as running:
        yield running


@pytest.fixture
def relay_environment(transactional_db: None, make_cluster, ssh_target: SshTarget) -> Environment:
    cluster = make_cluster(
        name="relay-slurm", agent_route=AgentRoute.VIA_LOGIN_HOST, relay_host="127.0.0.1"
    )
    environment = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    return environment


def relay_row(environment: Environment) -> AgentRelay:
    return AgentRelay.objects.get(cluster=environment.cluster)


def wait_relay_up(environment: Environment, platform: Platform, *, repairs: int = 0) -> float:
    """Seconds until the relay is up (with at least ``repairs`` repairs behind it)."""
    started = time.monotonic()

    def up() -> bool:
        row = AgentRelay.objects.filter(cluster=environment.cluster).first()
        return row is not None and row.state == "up" and row.repairs >= repairs

    try:
        wait_for(up, timeout=30, interval=0.05)
    except TimeoutError:
        pytest.fail(f"the relay did not come up\n{platform.logs()}")
    return time.monotonic() - started


def statuses(workers: list[Worker]) -> list[str]:
    return [w.status for w in Worker.objects.filter(pk__in=[w.pk for w in workers]).order_by("pk")]


def changes(workers: list[Worker]) -> int:
    return sum(w.events.count() for w in Worker.objects.filter(pk__in=[w.pk for w in workers]))


def hold_and_watch(workers: list[Worker], seconds: float) -> None:
    """Every worker stays connected, sampled all along."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert statuses(workers) == [S.CONNECTED] * len(workers)
        time.sleep(0.25)


def test_agents_told_only_the_relay_connect_and_stay_connected_through_drops(
    relay_platform: Platform, relay_environment: Environment, user, ssh_target: SshTarget
) -> None:
    platform = relay_platform
    cluster = relay_environment.cluster
    tag = relay_tag(cluster)
    first_up = wait_relay_up(relay_environment, platform)
    relay = relay_row(relay_environment)
    assert relay.address.startswith("127.0.0.1:") and relay.forwarded_port
    assert len(relay_pids(tag)) == 1

    requested = time.monotonic()
    workers = [
        services.request_worker(
            owner=user, cluster=cluster.name, environment=relay_environment.name
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: statuses(workers) == [S.CONNECTED] * 2, timeout=120, interval=0.1)
    except TimeoutError:
        pytest.fail(f"workers stayed {statuses(workers)}\n{platform.logs()}")
    to_connected = time.monotonic() - requested
    # Each agent was told the relay, and nothing of the platform's own address.
    for worker in workers:
        pids = agent_pids(worker.public_id)
        assert pids
        environ = Path(f"/proc/{pids[0]}/environ").read_bytes()
        assert f"ACTIVATE_URL=http://{relay.address}".encode() in environ.split(b"\0")
        assert HIDDEN_AGENTS_HOST.encode() not in environ
        assert str(platform.agent_port).encode() not in environ
        # Nor does the job script Slurm keeps (it is what every step of the job starts from).
        worker.refresh_from_db()
        script = subprocess.run(
            ["scontrol", "write", "batch_script", worker.scheduler_job_id, "-"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert f"ACTIVATE_URL=http://{relay.address}" in script
        assert HIDDEN_AGENTS_HOST not in script and str(platform.agent_port) not in script
    events_before = changes(workers)
    hold_and_watch(workers, HEARTBEAT_TIMEOUT + 2)

    # The SSH connection drops (its sshd session killed, as a network failure would end it).
    session = sshd_session_of(relay_pids(tag)[0])
    assert session
    os.kill(session, signal.SIGKILL)
    dropped = time.monotonic()
    wait_relay_up(relay_environment, platform, repairs=1)
    ssh_repair = time.monotonic() - dropped
    again = relay_row(relay_environment)
    assert again.address == relay.address
    assert again.forwarded_port != relay.forwarded_port
    hold_and_watch(workers, HEARTBEAT_TIMEOUT + 2)

    # The relay process on the login host is killed.
    killed_pid = relay_pids(tag)[0]
    os.kill(killed_pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_relay_up(relay_environment, platform, repairs=2)
    relay_repair = time.monotonic() - killed
    assert relay_repair < HEARTBEAT_TIMEOUT
    assert relay_pids(tag) and killed_pid not in relay_pids(tag)
    hold_and_watch(workers, HEARTBEAT_TIMEOUT + 2)

    assert changes(workers) == events_before, "a worker changed status"
    assert len(relay_pids(tag)) == 1
    print(
        f"\nrelay up after {first_up:.2f}s; 2 workers connected {to_connected:.1f}s after the "
        f"request; SSH drop repaired in {ssh_repair:.2f}s; killed relay repaired in "
        f"{relay_repair:.2f}s (heartbeat timeout {HEARTBEAT_TIMEOUT:g}s)"
    )
    for worker in workers:
        services.delete_worker(worker)
    wait_for(lambda: statuses(workers) == [S.STOPPED] * 2, timeout=60)
    wait_for(lambda: not set(squeue_names(ssh_target)) & {w.job_name for w in workers}, timeout=60)


NOT_AGENT_PATHS = ["/", "/admin/", "/api/workers/", "/health/", "/agent/../api/workers/"]


def test_the_relay_passes_agent_endpoints_only_and_one_relay_runs_per_cluster(
    relay_platform: Platform, relay_environment: Environment
) -> None:
    platform = relay_platform
    cluster = relay_environment.cluster
    wait_relay_up(relay_environment, platform)
    base = f"http://{relay_row(relay_environment).address}"

    # Through the relay, the SSH forward and the agents' server on the hidden address.
    assert httpx.get(f"{base}/agent/v1/ping", timeout=5).status_code == 200
    for path in NOT_AGENT_PATHS:
        answer = httpx.get(f"{base}{path}", timeout=5)
        assert answer.status_code == 403, path
        assert "only the agent endpoints" in answer.text
    assert httpx.delete(f"{base}/agent/v1/heartbeat", timeout=5).status_code == 403

    # A second supervisor finds the lease taken and starts nothing; when the first dies, it
    # takes over within a lease.
    holder = relay_row(relay_environment).holder
    platform.start_relays(name="relays-2")
    time.sleep(3)
    assert len(relay_pids(relay_tag(cluster))) == 1
    assert relay_row(relay_environment).holder == holder
    platform.kill("relays")
    killed = time.monotonic()
    wait_for(lambda: relay_row(relay_environment).holder != holder, timeout=20, interval=0.05)
    wait_relay_up(relay_environment, platform)
    takeover = time.monotonic() - killed
    # Within the lease it held (2 s) plus a check and a set-up.
    assert takeover < float(KNOBS["ACTIVATE_RELAY_LEASE"]) + 3
    print(f"\nrun_relays killed: the other one took the relay over in {takeover:.2f}s")
    assert httpx.get(f"{base}/agent/v1/ping", timeout=5).status_code == 200
    wait_for(lambda: len(relay_pids(relay_tag(cluster))) == 1, timeout=10)

    # Switched back to direct: the relay stops on the login host.
    cluster.agent_route = AgentRoute.DIRECT
    cluster.save(update_fields=["agent_route"])
    wait_for(lambda: not relay_pids(relay_tag(cluster)), timeout=20, interval=0.1)
    wait_for(lambda: relay_row(relay_environment).state == "stopped", timeout=20)

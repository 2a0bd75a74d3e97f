"""Agents that cannot reach the platform: via the login host, on the real Slurm over real SSH.

The agents' server listens on 127.0.0.7, an address the job script never names: agents are
given only the relay's address on the login host (this machine, 127.0.0.1), and every call they
make goes relay -> the login host's loopback -> the platform's SSH connection -> agents' server.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import textwrap
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
from tests.node.test_relay_script import whole
from workers_app.actions import deletion, requests
from workers_app.models import AgentRelay, AgentRoute, Environment, EnvironmentField, Worker
from workers_app.relays import relay_tag
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


# README: an SSH connection killed on the server side repaired in 0.11 to 0.27 s, a killed relay
# in 0.16 to 0.27 s: the keeper sets them up again at once, not at its next check. Here the
# checks are 2.4 s apart (a lease of 7.5 s) and each fault comes just after one, so a repair
# that waited for the next check would take more than twice this bound.
REPAIR_WITHIN = 1.0
SLOW_CHECKS = {**KNOBS, "ACTIVATE_RELAY_LEASE": "7.5", "ACTIVATE_RELAY_CHECK_INTERVAL": "2.4"}


@pytest.fixture
def relay_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path, knobs=KNOBS, agent_host=HIDDEN_AGENTS_HOST, relays=True)
    with platform.running() as running:
        yield running


@pytest.fixture
def slow_checks_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(
        workdir=tmp_path, knobs=SLOW_CHECKS, agent_host=HIDDEN_AGENTS_HOST, relays=True
    )
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


def just_checked(environment: Environment) -> None:
    """Returns as the relay's keeper has finished a check (its next is a whole interval away)."""
    before = relay_row(environment).checked_at
    wait_for(lambda: relay_row(environment).checked_at != before, timeout=10, interval=0.02)


def hold_and_watch(workers: list[Worker], seconds: float) -> None:
    """Every worker stays connected, sampled all along."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert statuses(workers) == [S.CONNECTED] * len(workers)
        time.sleep(0.25)


def test_agents_told_only_the_relay_connect_and_stay_connected_through_drops(
    slow_checks_platform: Platform, relay_environment: Environment, user, ssh_target: SshTarget
) -> None:
    platform = slow_checks_platform
    cluster = relay_environment.cluster
    tag = relay_tag(cluster)
    first_up = wait_relay_up(relay_environment, platform)
    relay = relay_row(relay_environment)
    assert relay.address.startswith("127.0.0.1:") and relay.forwarded_port
    assert len(relay_pids(tag)) == 1

    requested = time.monotonic()
    workers = [
        requests.request_worker(
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
    just_checked(relay_environment)
    os.kill(session, signal.SIGKILL)
    dropped = time.monotonic()
    wait_relay_up(relay_environment, platform, repairs=1)
    ssh_repair = time.monotonic() - dropped
    assert ssh_repair < REPAIR_WITHIN, f"SSH drop repaired in {ssh_repair:.2f}s"
    again = relay_row(relay_environment)
    assert again.address == relay.address
    assert again.forwarded_port != relay.forwarded_port
    hold_and_watch(workers, HEARTBEAT_TIMEOUT + 2)

    # The relay process on the login host is killed.
    killed_pid = relay_pids(tag)[0]
    just_checked(relay_environment)
    os.kill(killed_pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_relay_up(relay_environment, platform, repairs=2)
    relay_repair = time.monotonic() - killed
    assert relay_repair < REPAIR_WITHIN, f"killed relay repaired in {relay_repair:.2f}s"
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
        deletion.delete_worker(worker)
    wait_for(lambda: statuses(workers) == [S.STOPPED] * 2, timeout=60)
    wait_for(lambda: not set(squeue_names(ssh_target)) & {w.job_name for w in workers}, timeout=60)


NOT_AGENT_PATHS = [
    "/",
    "/admin/",
    "/api/workers/",
    "/health/",
    "/agent/../api/workers/",
    "/agent/v1/../../api/workers/",
    "/agent/%2e%2e/api/workers/",
    "/agent/v1/%2E%2E/%2E%2E/admin/",
]


def raw_get(address: str, path: str) -> tuple[int, str]:
    """GET ``path`` byte for byte as given (no client normalises it): status and body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


def test_the_relay_passes_agent_endpoints_only_and_one_relay_runs_per_cluster(
    relay_platform: Platform, relay_environment: Environment
) -> None:
    platform = relay_platform
    cluster = relay_environment.cluster
    wait_relay_up(relay_environment, platform)
    base = f"http://{relay_row(relay_environment).address}"

    # Through the relay, the SSH forward and the agents' server on the hidden address.
    assert httpx.get(f"{base}/agent/v1/ping", timeout=5).status_code == 200
    address = relay_row(relay_environment).address
    assert raw_get(address, "/agent/v1/ping")[0] == 200  # the raw client itself works
    for path in NOT_AGENT_PATHS:
        status, body = raw_get(address, path)
        assert status == 403, path
        assert "only the agent endpoints" in body
    deleting = httpx.delete(f"{base}/agent/v1/heartbeat", timeout=5)
    assert deleting.status_code == 403 and "only the agent endpoints" in deleting.text
    # A call that is not signed as agents sign theirs (a secret in plain text) stops here.
    unsigned = httpx.post(
        f"{base}/agent/v1/heartbeat",
        json={"worker": "w1"},
        headers={"Authorization": "Bearer a-worker-secret"},
        timeout=5,
    )
    assert unsigned.status_code == 401 and "agent calls are signed" in unsigned.text

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


# The neighbour: another Unix user of the login host, never root, with the host's own Python.
NEIGHBOUR = "pwbob"
NODE_PYTHON = "/usr/bin/python3"


def as_neighbour(code: str, *args: str, timeout: float = 30) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["runuser", "-u", NEIGHBOUR, "--", NODE_PYTHON, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        start_new_session=True,
    )


def neighbour_output(code: str, *args: str, timeout: float = 30) -> str:
    process = as_neighbour(code, *args)
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


# Connects to a port of the login host's loopback, sends one request, prints what came back.
ASK_PORT = """
    import socket, sys
    port, path, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    request = "GET %s HTTP/1.1\\r\\nHost: %s\\r\\nX-Pad: %s\\r\\nConnection: close\\r\\n\\r\\n"
    client = socket.create_connection(("127.0.0.1", port), timeout=15)
    client.sendall((request % (path, host, "x" * 80)).encode())
    answer = b""
    try:
        while True:
            chunk = client.recv(65536)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    print(repr(answer))
"""


def test_a_neighbour_connecting_to_the_forward_on_the_login_host_reaches_nothing(
    relay_platform: Platform, relay_environment: Environment
) -> None:
    wait_relay_up(relay_environment, relay_platform)
    relay = relay_row(relay_environment)
    assert relay.forwarded_port
    # The neighbour even names the agents' server as the relay does.
    host = f"{HIDDEN_AGENTS_HOST}:{relay_platform.agent_port}"
    for path in ("/agent/v1/ping", "/health/", "/api/workers/"):
        answer = neighbour_output(ASK_PORT, str(relay.forwarded_port), path, host)
        assert answer.strip() == "b''", (path, answer)
    # The relay, which has the forward's proof, still gets through.
    base = f"http://{relay.address}"
    assert httpx.get(f"{base}/agent/v1/ping", timeout=5).status_code == 200


# Tries to listen on a port, each family and address on its own, SO_REUSEADDR set; prints what
# it could take.
TAKE_PORT = """
    import socket, sys
    port = int(sys.argv[1])
    taken = []
    for family, address in [
        (socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1"),
        (socket.AF_INET6, "::"), (socket.AF_INET6, "::1"),
    ]:
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            server.bind((address, port))
            server.listen(1)
            taken.append(address)
        except OSError:
            pass
        server.close()
    print(" ".join(taken))
"""


def test_a_relay_on_every_interface_leaves_its_port_to_no_neighbour_on_ipv4_or_ipv6(
    relay_platform: Platform, relay_environment: Environment
) -> None:
    cluster = relay_environment.cluster
    wait_relay_up(relay_environment, relay_platform)
    cluster.relay_host = ""
    cluster.save(update_fields=["relay_host"])
    wait_for(
        lambda: (
            relay_row(relay_environment).state == "up"
            and not relay_row(relay_environment).address.startswith("127.0.0.1:")
        ),
        timeout=30,
        interval=0.05,
    )
    relay = relay_row(relay_environment)
    port = int(relay.address.rpartition(":")[2])
    # Agents are told the login host's name; whatever it resolves to, the port is the relay's.
    assert neighbour_output(TAKE_PORT, str(port)).strip() == ""
    assert httpx.get(f"http://127.0.0.1:{port}/agent/v1/ping", timeout=5).status_code == 200
    assert httpx.get(f"http://[::1]:{port}/agent/v1/ping", timeout=5).status_code == 200


# Waits for a port to come free, takes it (SO_REUSEADDR, as the relay does) and plays the relay
# for a while: records every request that arrives and answers it 403, unsigned, as the platform
# answered a refused secret.
SQUAT_PORT = """
    import base64, socket, sys, time
    port, hold = int(sys.argv[1]), float(sys.argv[2])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 30
    while True:
        try:
            server.bind(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                print("NOT-BOUND", flush=True)
                sys.exit(0)
            time.sleep(0.001)
    server.listen(16)
    print("BOUND", flush=True)
    server.settimeout(0.2)
    until = time.monotonic() + hold
    while time.monotonic() < until:
        try:
            client, _ = server.accept()
        except OSError:
            continue
        client.settimeout(2)
        data = b""
        try:
            while b"\\r\\n\\r\\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\\r\\n\\r\\n")
            length = 0
            for line in head.split(b"\\r\\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = client.recv(65536)
                if not chunk:
                    break
                body += chunk
            data = head + b"\\r\\n\\r\\n" + body
            answer = b'{"error": "forbidden"}'
            client.sendall(
                b"HTTP/1.1 403 Forbidden\\r\\nContent-Type: application/json\\r\\n"
                b"Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n%s" % (len(answer), answer)
            )
        except OSError:
            pass
        client.close()
        print("CAUGHT " + base64.b64encode(data).decode(), flush=True)
    server.close()
    print("RELEASED", flush=True)
"""


def send_raw(address: str, request: bytes) -> tuple[int, str, bool]:
    """Sends bytes as they are to host:port: the answer's status (0 if none), its body, and
    whether it is signed. The relay keeps an HTTP/1.1 connection open after its answer."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as client:
        client.sendall(request)
        answer = b""
        while not whole(answer) and (chunk := client.recv(65536)):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    signed = b"\r\nx-activate-signature:" in head.lower()
    return status, body.decode(errors="replace"), signed


def refused(answer: tuple[int, str, bool], reason: str) -> bool:
    """The platform's refusal of an agent call it cannot prove (401, unsigned), for ``reason``;
    not the relay's own 502, nor no answer."""
    status, body, signed = answer
    try:
        error = json.loads(body).get("error")
    except ValueError:
        return False
    return (status, error, signed) == (401, reason, False)


def other_request(captured: bytes, public_id: str) -> bytes:
    """The captured request made into another one: a connect naming another host, its headers
    (and whatever proof they carry) kept."""
    head, _, _ = captured.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, _, version = lines[0].split(b" ")
    body = json.dumps(
        {"worker": public_id, "hostname": "elsewhere.example", "job_id": "1"}
    ).encode()
    headers = [line for line in lines[1:] if not line.lower().startswith(b"content-length:")]
    headers.append(b"Content-Length: %d" % len(body))
    first = b" ".join([method, b"/agent/v1/connect", version])
    return b"\r\n".join([first, *headers]) + b"\r\n\r\n" + body


def test_a_neighbour_who_takes_the_relays_port_during_a_restart_gets_nothing_of_use(
    relay_platform: Platform, relay_environment: Environment, user, ssh_target: SshTarget
) -> None:
    platform = relay_platform
    cluster = relay_environment.cluster
    tag = relay_tag(cluster)
    wait_relay_up(relay_environment, platform)
    relay = relay_row(relay_environment)
    workers = [
        requests.request_worker(
            owner=user, cluster=cluster.name, environment=relay_environment.name
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: statuses(workers) == [S.CONNECTED] * 2, timeout=120, interval=0.1)
    except TimeoutError:
        pytest.fail(f"workers stayed {statuses(workers)}\n{platform.logs()}")
    agents = {w.public_id: agent_pids(w.public_id) for w in workers}
    events_before = changes(workers)
    repairs = relay_row(relay_environment).repairs

    # The neighbour waits on the relay's port; the relay is killed (a crash, a redeploy).
    port = int(relay.address.rpartition(":")[2])
    squatter = as_neighbour(SQUAT_PORT, str(port), str(3 * HEARTBEAT_INTERVAL + 1))
    time.sleep(0.5)
    os.kill(relay_pids(tag)[0], signal.SIGKILL)
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "BOUND"
    out, err = squatter.communicate(timeout=60)
    captured = [
        base64.b64decode(line.split()[1]) for line in out.splitlines() if line.startswith("CAUGHT")
    ]
    assert captured, f"the neighbour caught nothing\n{err}"
    wait_relay_up(relay_environment, platform, repairs=repairs + 1)
    assert relay_row(relay_environment).address == relay.address

    # Every agent kept going through the relay that is back, and every worker stayed connected.
    hold_and_watch(workers, HEARTBEAT_TIMEOUT + 2)
    assert {w.public_id: agent_pids(w.public_id) for w in workers} == agents

    # Then whatever it caught is refused by the platform: sent on late (the platform never saw
    # it: the agent signed a new call for each retry, and later ones were accepted), sent again,
    # or made into another request with the same credentials.
    # A held-back call is refused as a replay too: the agent's later calls were accepted.
    for request in captured:
        late = send_raw(relay.address, request)
        again = send_raw(relay.address, request)
        made_up = send_raw(relay.address, other_request(request, workers[0].public_id))
        assert refused(late, "replayed request"), (late, request[:200])
        assert refused(again, "replayed request"), (again, request[:200])
        assert refused(made_up, "bad signature"), (made_up, request[:200])
    assert not Worker.objects.filter(node_hostname="elsewhere.example").exists()
    hold_and_watch(workers, 2)
    assert changes(workers) == events_before, "a worker changed status"
    print(
        f"\nthe neighbour held the relay's port for {3 * HEARTBEAT_INTERVAL + 1:g}s and caught "
        f"{len(captured)} calls, each refused when sent on late, replayed or altered; no worker "
        f"changed status"
    )
    for worker in workers:
        deletion.delete_worker(worker)
    wait_for(lambda: statuses(workers) == [S.STOPPED] * 2, timeout=60)
    wait_for(lambda: not set(squeue_names(ssh_target)) & {w.job_name for w in workers}, timeout=60)

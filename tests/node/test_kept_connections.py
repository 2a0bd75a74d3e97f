"""Beats as agents send them: the node agent keeps one HTTP/1.1 connection across its calls, and
the login host's relay keeps its agents' connections and its own to the platform. Against the
real agents' server (`scripts/start.sh agents`), with a counting TCP proxy in front of what the
agent calls and the server's own count of the beats it answered."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.transport.tunnel import BOOT
from harness.clocks import Answered, beats_answered
from harness.platform import Platform
from node import activate_agent, relay_source
from tests.agents.heartbeats.signed import worker_with_key
from tests.node.test_relay_script import PROOF

pytestmark = pytest.mark.django_db(transaction=True)
INTERVAL = 30.0  # never waited for: the tests beat themselves


def pump(source: socket.socket, sink: socket.socket, cut: threading.Event) -> None:
    """Bytes from source to sink until either ends; ``cut`` set: the next bytes are dropped and
    both ends closed instead (the way they came, cut off). Each piece is sent on at once, as
    sshd sends what it forwards (TCP_NODELAY): an answer's head and body, written apart, would
    otherwise wait for the other side's delayed ACK."""
    sink.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while data := source.recv(65536):
            if cut.is_set():
                cut.clear()
                break
            sink.sendall(data)
    except OSError:
        pass
    for end in (source, sink):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        end.close()


@dataclass
class CountingProxy:
    """A TCP proxy that counts the connections it accepts; it can cut the next request on its
    way (as if the server had closed the kept connection just then) or the next answer (the
    server took the request; its answer is lost)."""

    target: tuple[str, int]
    server: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    accepted: int = 0
    cut_request: threading.Event = field(default_factory=threading.Event)
    cut_answer: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            for ends, cut in (
                ((client, upstream), self.cut_request),
                ((upstream, client), self.cut_answer),
            ):
                threading.Thread(target=pump, args=(*ends, cut), daemon=True).start()


@dataclass
class ProvingForward:
    """The platform's end of the SSH forward as core/transport/tunnel.py runs it: a connection
    that begins with the proof is joined to the agents' server, bytes both ways; counted."""

    target: tuple[str, int]
    server: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    joined: int = 0

    def __post_init__(self) -> None:
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.join, args=(conn,), daemon=True).start()

    def join(self, conn: socket.socket) -> None:
        expected = PROOF + b"\n"
        received = b""
        conn.settimeout(5)
        while len(received) < len(expected) and (chunk := conn.recv(len(expected) - len(received))):
            received += chunk
        if received != expected:
            conn.close()
            return
        self.joined += 1
        upstream = socket.create_connection(self.target, timeout=10)
        conn.settimeout(None)
        never = threading.Event()
        threading.Thread(target=pump, args=(upstream, conn, never), daemon=True).start()
        pump(conn, upstream, never)


# Seconds the agents' server keeps an idle connection here (shipped: 75, past a 30 s beat).
KEEP_ALIVE = 2


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path, knobs={"ACTIVATE_AGENT_KEEP_ALIVE": str(KEEP_ALIVE)})
    try:
        platform.start_agents()
        yield platform
    finally:
        platform.stop_all()


def server_address(platform: Platform) -> tuple[str, int]:
    return (platform.agent_host, platform.agent_port)


def answered(platform: Platform) -> Answered:
    return beats_answered(platform.workdir / "metrics")


def connected_agent(url: str) -> activate_agent.Agent:
    worker, signed = worker_with_key()
    platform = activate_agent.Platform(url, worker.public_id, signed.key_id, signed.key, timeout=5)
    identity = {"worker": worker.public_id, "hostname": "node7", "job_id": "123"}
    agent = activate_agent.Agent(platform, identity, INTERVAL)
    agent.beat()
    assert agent.connected
    return agent


def beat(agent: activate_agent.Agent) -> bool:
    """One beat, as the agent sends it; whether the platform took it (a signed 200)."""
    return agent.call("/agent/v1/heartbeat", {"worker": agent.identity["worker"]}) is not None


# -- the agent --------------------------------------------------------------------------------


def test_an_agents_calls_share_one_connection_and_each_beat_is_counted_once(
    platform: Platform,
) -> None:
    # Given an agent that connected through a counting proxy
    proxy = CountingProxy(server_address(platform))
    agent = connected_agent(proxy.url)
    # When it beats 20 times
    took = [beat(agent) for _ in range(20)]
    # Then the connect and all the beats went over one connection, and the server counted 20
    assert took == [True] * 20
    assert proxy.accepted == 1
    assert answered(platform) == Answered(20, {})


def test_the_agent_connects_again_once_the_server_closed_its_idle_connection(
    platform: Platform,
) -> None:
    proxy = CountingProxy(server_address(platform))
    agent = connected_agent(proxy.url)
    assert beat(agent)
    # When the connection sits idle past the server's keep-alive, which closes it
    time.sleep(KEEP_ALIVE + 0.5)
    # Then the next beat goes on a new connection, at once, and the one after on that one
    assert beat(agent) and beat(agent)
    assert proxy.accepted == 2
    assert answered(platform) == Answered(3, {})


def test_a_kept_connection_cut_as_a_beat_goes_out_is_sent_once_more_on_a_new_one(
    platform: Platform,
) -> None:
    proxy = CountingProxy(server_address(platform))
    agent = connected_agent(proxy.url)
    assert beat(agent)
    # When the server's side closes just as the next beat goes out (it never arrives)
    proxy.cut_request.set()
    # Then that beat is sent again on a new connection and taken, and counted once
    assert beat(agent)
    assert beat(agent)
    assert proxy.accepted == 2
    assert answered(platform) == Answered(3, {})


def test_a_beat_taken_whose_answer_was_lost_is_sent_again_and_not_counted_twice(
    platform: Platform,
) -> None:
    proxy = CountingProxy(server_address(platform))
    agent = connected_agent(proxy.url)
    assert beat(agent)
    # When the server takes a beat but its answer is lost on the way back
    proxy.cut_answer.set()
    lost = beat(agent)
    # Then the agent sends the very same request again, which the server refuses as a replay
    # (unsigned: the agent retries at its next beat): three beats sent, three counted
    assert not lost
    assert beat(agent)
    assert proxy.accepted == 2
    assert answered(platform) == Answered(4, {"401": 1})


def test_the_agent_beats_on_after_the_agents_server_restarts(platform: Platform) -> None:
    proxy = CountingProxy(server_address(platform))
    agent = connected_agent(proxy.url)
    assert [beat(agent) for _ in range(5)] == [True] * 5
    # When the server stops (closing its kept connections) and comes back on its port
    platform.stop("agents")
    assert not beat(agent)
    platform.start_agents()
    # Then the agent beats again, on one new connection for all its next beats
    assert beat(agent)
    before = proxy.accepted
    assert [beat(agent) for _ in range(10)] == [True] * 10
    assert proxy.accepted == before
    # and the server counted every beat it took once: 5 before and 11 after
    assert answered(platform) == Answered(16, {})


@dataclass
class ForwardProxy:
    """An HTTP proxy as sites run them for http URLs: requests name the whole URL, which it
    turns into the path before passing them on; it counts connections and what it was asked."""

    target: tuple[str, int]
    server: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    accepted: int = 0
    asked: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target, timeout=10)
            never = threading.Event()
            threading.Thread(target=pump, args=(upstream, client, never), daemon=True).start()
            threading.Thread(target=self.requests, args=(client, upstream), daemon=True).start()

    def requests(self, client: socket.socket, upstream: socket.socket) -> None:
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        prefix = b"http://%s:%d" % (self.target[0].encode(), self.target[1])
        data = b""
        with client, upstream:
            while True:
                while b"\r\n\r\n" not in data:
                    if not (chunk := client.recv(65536)):
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                line, _, headers = head.partition(b"\r\n")
                length = int(headers.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += client.recv(65536)
                body, data = data[:length], data[length:]
                method, url, version = line.split(b" ")
                self.asked.append(url)
                line = b" ".join([method, url.removeprefix(prefix), version])
                upstream.sendall(line + b"\r\n" + headers + b"\r\n\r\n" + body)


def test_the_agent_goes_through_the_proxy_its_environment_names_on_one_connection(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = ForwardProxy(server_address(platform))
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    agent = connected_agent(platform.agent_url)
    assert [beat(agent) for _ in range(5)] == [True] * 5
    assert proxy.accepted == 1
    assert proxy.asked[-1] == f"{platform.agent_url}/agent/v1/heartbeat".encode()
    assert len(proxy.asked) == 6
    # and not for a host its no_proxy names
    monkeypatch.setenv("no_proxy", platform.agent_host)
    direct = connected_agent(platform.agent_url)
    assert beat(direct)
    assert len(proxy.asked) == 6
    assert answered(platform) == Answered(6, {})


# -- the relay --------------------------------------------------------------------------------


@dataclass
class Relay:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_relay(home: Path, forwarded_port: int, host: str, **bounds: float) -> Relay:
    """The relay as the platform starts it (its source and the proof on stdin), with some of its
    bounds made shorter: ``KEEP_IDLE=1.0`` and the like."""
    source = relay_source()
    for name, value in bounds.items():
        line = f"\n{name} = "
        assert source.count(line) == 1, name
        start = source.index(line) + len(line)
        source = source[:start] + repr(value) + source[source.index("\n", start) :]
    encoded = source.encode()
    argv = [sys.executable, "-c", BOOT, "activate-relay", "kept", "127.0.0.1", "0"]
    process = subprocess.Popen(
        [*argv, str(forwarded_port), host],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(home)},
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"{len(encoded)}\n".encode() + encoded + PROOF + b"\n")
    process.stdin.flush()
    assert select.select([process.stdout], [], [], 10)[0], "the relay printed nothing"
    ready = process.stdout.readline().decode().split()
    assert ready[:1] == ["READY"], ready
    return Relay(process, int(ready[1]))


@pytest.fixture
def relayed(tmp_path: Path, platform: Platform) -> Iterator[tuple[ProvingForward, Path, str]]:
    """Where the relay passes calls (the forward), its home, and the agents' server's name."""
    forward = ProvingForward(server_address(platform))
    yield forward, tmp_path, f"{platform.agent_host}:{platform.agent_port}"


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for relay in started:
        relay.process.kill()
        relay.process.wait()


def ping(sock: socket.socket, extra: bytes = b"") -> bytes:
    """One GET /agent/v1/ping on ``sock``: the answer's head and body as they came."""
    sock.sendall(b"GET /agent/v1/ping HTTP/1.1\r\nHost: login1\r\n" + extra + b"\r\n")
    return read_answer(sock)


def read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return data


def test_the_relay_serves_an_agents_calls_on_one_connection_and_keeps_its_own_to_the_platform(
    platform: Platform, relayed: tuple[ProvingForward, Path, str], relays: list[Relay]
) -> None:
    forward, home, host = relayed
    relays.append(relay := start_relay(home, forward.port, host))
    proxy = CountingProxy(("127.0.0.1", relay.port))
    # When an agent connects and beats 20 times through the relay
    agent = connected_agent(proxy.url)
    assert [beat(agent) for _ in range(20)] == [True] * 20
    # Then one connection carried them to the relay, one from the relay to the platform
    assert (proxy.accepted, forward.joined) == (1, 1)
    assert answered(platform) == Answered(20, {})


def test_the_relay_closes_a_connection_idle_past_its_bound_and_the_agent_connects_again(
    platform: Platform, relayed: tuple[ProvingForward, Path, str], relays: list[Relay]
) -> None:
    forward, home, host = relayed
    relays.append(relay := start_relay(home, forward.port, host, KEEP_IDLE=1.0))
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
        assert b"Connection: keep-alive" in ping(sock)
        assert b"Connection: keep-alive" in ping(sock)
        # When the connection then sits idle, then the relay closes it after its bound
        idle_since = time.monotonic()
        assert sock.recv(1) == b""
        assert 0.9 <= time.monotonic() - idle_since < 3
    # and an agent's kept connection closed so is opened again for its next beat
    proxy = CountingProxy(("127.0.0.1", relay.port))
    agent = connected_agent(proxy.url)
    time.sleep(1.5)
    assert beat(agent) and beat(agent)
    assert proxy.accepted == 2
    assert answered(platform) == Answered(2, {})


def test_the_relay_serves_at_most_its_bound_of_requests_on_a_connection(
    platform: Platform, relayed: tuple[ProvingForward, Path, str], relays: list[Relay]
) -> None:
    forward, home, host = relayed
    relays.append(relay := start_relay(home, forward.port, host, MAX_REQUESTS_PER_CONNECTION=3))
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
        answers = [ping(sock) for _ in range(3)]
        assert [b"Connection: keep-alive" in answer for answer in answers] == [True, True, False]
        assert b"Connection: close" in answers[2]
        assert sock.recv(1) == b""
    # An agent's calls: connect and five beats, three on each connection
    proxy = CountingProxy(("127.0.0.1", relay.port))
    agent = connected_agent(proxy.url)
    assert [beat(agent) for _ in range(5)] == [True] * 5
    assert proxy.accepted == 2
    assert answered(platform) == Answered(5, {})


def test_each_request_on_a_kept_connection_is_bounded_as_the_first(
    platform: Platform, relayed: tuple[ProvingForward, Path, str], relays: list[Relay]
) -> None:
    forward, home, host = relayed
    relays.append(relay := start_relay(home, forward.port, host))
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
        assert ping(sock).startswith(b"HTTP/1.1 200 ")
        # A second request too large is refused at the relay, and the connection closed
        sock.sendall(
            b"POST /agent/v1/heartbeat HTTP/1.1\r\nHost: login1\r\n"
            b"Authorization: ActivateHMAC x\r\nContent-Length: 70000\r\n\r\n"
        )
        assert read_answer(sock).startswith(b"HTTP/1.1 413 ")
        assert sock.recv(1) == b""
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
        assert ping(sock).startswith(b"HTTP/1.1 200 ")
        # and one for another path, which never reaches the platform
        sock.sendall(b"GET /admin/ HTTP/1.1\r\nHost: login1\r\n\r\n")
        assert read_answer(sock).startswith(b"HTTP/1.1 403 ")
        assert sock.recv(1) == b""

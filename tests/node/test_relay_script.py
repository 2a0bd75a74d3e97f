"""The login host's relay as it runs there (a python3 process fed its source and the forward's
proof on stdin), in front of a stand-in for the forwarded port that records what reaches it:
signed agent calls pass behind the proof and with the platform's Host; anything else is refused
before it leaves the relay. (Kept connections against the real agents' server:
tests/node/test_kept_connections.py.)"""

from __future__ import annotations

import os
import secrets
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
from node import relay_source

UPSTREAM_HOST = "agents.platform.example:8001"
PROOF = secrets.token_hex(32).encode()
SIGNED = b"Authorization: ActivateHMAC worker=wabc,key=k1,ts=1,nonce=n,sig=s\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@dataclass
class Upstream:
    """What the platform's side of the forward received: one raw request per connection."""

    server: socket.socket
    received: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                conn.settimeout(5)
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    body += conn.recv(65536)
                self.received.append(head + b"\r\n\r\n" + body[:length])
                conn.sendall(ANSWER)


@dataclass
class Relay:
    process: subprocess.Popen[bytes]
    port: int
    tag: str
    home: Path


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = socket.create_server(("127.0.0.1", 0))
    stand_in = Upstream(server)
    threading.Thread(target=stand_in.serve, daemon=True).start()
    yield stand_in
    server.close()


def launch(home: Path, forwarded_port: int, tag: str, proof: bytes) -> subprocess.Popen[bytes]:
    source = relay_source().encode()
    argv = [sys.executable, "-c", BOOT, "activate-relay", tag, "127.0.0.1", "0"]
    process = subprocess.Popen(
        [*argv, str(forwarded_port), UPSTREAM_HOST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(home)},
    )
    assert process.stdin is not None
    process.stdin.write(f"{len(source)}\n".encode() + source + proof + b"\n")
    process.stdin.flush()
    return process


def first_line(process: subprocess.Popen[bytes], timeout: float = 10) -> list[str]:
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    assert readable, "the relay printed nothing"
    return process.stdout.readline().decode().split()


def start_relay(home: Path, forwarded_port: int, tag: str = "test-1") -> Relay:
    process = launch(home, forwarded_port, tag, PROOF)
    ready = first_line(process)
    assert ready[:1] == ["READY"] and len(ready) == 3, ready
    return Relay(process=process, port=int(ready[1]), tag=tag, home=home)


@pytest.fixture
def relay(tmp_path: Path, upstream: Upstream) -> Iterator[Relay]:
    started = start_relay(tmp_path, upstream.port)
    yield started
    started.process.kill()
    started.process.wait()


def whole(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole response (the relay always frames it by length)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if sep and name.lower() == b"content-length":
            return len(body) >= int(value)
    return False


def exchange(relay: Relay, raw: bytes) -> bytes:
    """Everything the relay answers ``raw`` until it closes or has answered once whole (a kept
    connection stays open for the next request)."""
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
        sock.sendall(raw)
        answer = b""
        while not whole(answer) and (chunk := sock.recv(65536)):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def behind_proof(sent: bytes) -> bytes:
    """What followed the proof line, which every forwarded connection must begin with."""
    assert sent.startswith(PROOF + b"\n"), sent[:80]
    return sent[len(PROOF) + 1 :]


def test_an_agent_call_passes_with_the_platforms_host_and_a_request_pipelined_behind_it_never(
    relay: Relay, upstream: Upstream
) -> None:
    body = b'{"worker": "wabc"}'
    request = (
        b"POST /agent/v1/heartbeat HTTP/1.1\r\nHost: login1:40123\r\n"
        + SIGNED
        + b"Connection: keep-alive\r\n"
        b"X-Forwarded-Proto: https\r\n" + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    # A second request sent along before the first was answered is never read: the connection
    # closes after the first answer.
    smuggled = b"GET /admin/ HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
        sock.sendall(request + smuggled)
        answered = b""
        while chunk := sock.recv(65536):
            answered += chunk
    assert answered == ANSWER
    assert len(upstream.received) == 1
    sent = behind_proof(upstream.received[0])
    head, _, sent_body = sent.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /agent/v1/heartbeat HTTP/1.1"
    assert f"Host: {UPSTREAM_HOST}".encode() in lines
    assert b"Host: login1:40123" not in lines
    assert SIGNED.rstrip() in lines
    # How the relay's connection to the platform ends is the relay's own business.
    assert not [line for line in lines if line.lower().startswith(b"connection:")]
    assert b"X-Forwarded-Proto: https" not in lines  # only the platform's own proxy says that
    assert sent_body == body


@pytest.mark.parametrize(
    "authorization",
    [b"", b"Authorization: Bearer s3cret\r\n", b"Authorization: Basic YTpi\r\n"],
)
def test_a_post_not_signed_as_agents_sign_is_refused_at_the_relay(
    relay: Relay, upstream: Upstream, authorization: bytes
) -> None:
    body = b'{"worker": "wabc"}'
    answer = exchange(
        relay,
        b"POST /agent/v1/heartbeat HTTP/1.1\r\nHost: login1\r\n"
        + authorization
        + b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert status_of(answer) == 401
    assert upstream.received == []


def test_a_read_passes_behind_the_proof(relay: Relay, upstream: Upstream) -> None:
    answered = exchange(relay, b"GET /agent/v1/ping HTTP/1.1\r\nHost: login1\r\n\r\n")
    # An HTTP/1.1 client keeps its connection to the relay, whatever the platform's side did.
    assert answered == ANSWER.replace(b"Connection: close", b"Connection: keep-alive")
    assert behind_proof(upstream.received[0]).startswith(b"GET /agent/v1/ping HTTP/1.1\r\n")


@pytest.mark.parametrize("proof", [b"", b"short"])
def test_without_a_proof_for_the_forward_the_relay_never_listens(
    tmp_path: Path, upstream: Upstream, proof: bytes
) -> None:
    process = launch(tmp_path, upstream.port, "test-1", proof)
    assert process.wait(timeout=10) == 2
    assert process.stdout is not None and process.stdout.read() == b""
    assert not (tmp_path / ".activate" / "relay-test-1.pid").exists()


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET / HTTP/1.1",
        b"GET /admin/ HTTP/1.1",
        b"GET /api/workers/ HTTP/1.1",
        b"POST /api/workers/ HTTP/1.1",
        b"GET /health/ HTTP/1.1",
        b"GET /agent HTTP/1.1",
        b"GET /agent/../api/workers/ HTTP/1.1",
        b"GET /agent//admin/ HTTP/1.1",
        b"GET /agent/v1/%2e%2e/api/ HTTP/1.1",
        b"GET http://platform/api/workers/ HTTP/1.1",
        b"DELETE /agent/v1/heartbeat HTTP/1.1",
        b"CONNECT platform:8000 HTTP/1.1",
        b"GET /agent/v1/ping HTTP/2.0",
        b"GET /agent/v1/ping",
    ],
)
def test_anything_but_an_agent_endpoint_is_refused_at_the_relay(
    relay: Relay, upstream: Upstream, request_line: bytes
) -> None:
    answer = exchange(relay, request_line + b"\r\nHost: login1\r\n\r\n")
    assert status_of(answer) in {400, 403}
    assert upstream.received == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Transfer-Encoding: chunked\r\n", 411),
        (b"Content-Length: 999999\r\n", 413),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400),
        (b"Content-Length: -1\r\n", 400),
        (b" Host: folded\r\n", 400),
        (b"X-Big: " + b"a" * 9000 + b"\r\n", 431),
    ],
)
def test_bodies_it_cannot_bound_are_refused(
    relay: Relay, upstream: Upstream, headers: bytes, status: int
) -> None:
    answer = exchange(relay, b"POST /agent/v1/heartbeat HTTP/1.1\r\n" + headers + b"\r\n")
    assert status_of(answer) == status
    assert upstream.received == []


def test_the_relay_ends_with_its_ssh_session_and_a_new_one_replaces_an_old_one(
    tmp_path: Path, upstream: Upstream
) -> None:
    first = start_relay(tmp_path, upstream.port)
    pidfile = tmp_path / ".activate" / f"relay-{first.tag}.pid"
    assert pidfile.read_text().strip() == str(first.process.pid)
    # A second relay of the same cluster and installation stops the first before it listens.
    second = start_relay(tmp_path, upstream.port)
    assert first.process.wait(timeout=10) == 0
    assert pidfile.read_text().strip() == str(second.process.pid)
    # Its stdin closing (the SSH session ended) ends it, and its pid file with it.
    assert second.process.stdin is not None
    second.process.stdin.close()
    assert second.process.wait(timeout=10) == 0
    deadline = time.monotonic() + 5
    while pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pidfile.exists()


def test_a_relay_of_another_cluster_is_left_alone(tmp_path: Path, upstream: Upstream) -> None:
    one = start_relay(tmp_path, upstream.port, tag="inst-1")
    other = start_relay(tmp_path, upstream.port, tag="inst-2")
    try:
        time.sleep(0.3)
        assert one.process.poll() is None and other.process.poll() is None
    finally:
        for relay in (one, other):
            relay.process.kill()
            relay.process.wait()


def test_an_answer_cut_off_on_the_way_back_becomes_a_clean_502(tmp_path: Path) -> None:
    # The platform's side dies mid-answer (an SSH connection dropping): half a response must not
    # reach the agent, whose HTTP client would choke on it.
    server = socket.create_server(("127.0.0.1", 0))

    def cut_off() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{"status":')

    threading.Thread(target=cut_off, daemon=True).start()
    relay = start_relay(tmp_path, int(server.getsockname()[1]))
    try:
        answer = exchange(relay, b"GET /agent/v1/ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(answer) == 502
        assert answer.endswith(b"the platform's answer was cut off\n")
    finally:
        relay.process.kill()
        relay.process.wait()
        server.close()

"""direct-tcpip channels through the test cluster's sshd to a server on this machine: one HTTP
request read to its end, and a channel seen from asyncio as a stream pair."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core.transport.channels import ChannelPipe, http_request
from core.transport.connection import SSHConnection
from core.transport.errors import SSHError

pytestmark = pytest.mark.slurm
MESSAGE = b"hello through the login host\n" * 10_000  # several SSH windows' worth


class EchoHandler(BaseHTTPRequestHandler):
    """Answers every POST with what it was sent, and the request's target in a header."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Target", self.path)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP server that sends back what it receives, then closes when the client does."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def test_one_http_request_over_a_channel_is_read_to_its_end(
    ssh: SSHConnection, http_port: int
) -> None:
    body = b"x" * 300_000  # several SSH windows' worth each way
    channel = ssh.open_tunnel("127.0.0.1", http_port)
    try:
        headers = [("Host", f"127.0.0.1:{http_port}"), ("Content-Length", str(len(body)))]
        status, answer_headers, content = http_request(channel, "POST", "/login?a=1", headers, body)
    finally:
        channel.close()
        ssh.tunnel_closed()
    assert status == 201 and content == body
    assert (b"x-target", b"/login?a=1") in answer_headers


def test_a_channel_pipe_carries_bytes_both_ways_and_closes_once(
    ssh: SSHConnection, echo_port: int
) -> None:
    in_use_before = ssh.in_use
    closed: list[bool] = []

    def closed_once() -> None:
        closed.append(True)
        ssh.tunnel_closed()

    async def talk() -> bytes:
        pipe = ChannelPipe(ssh.open_tunnel("127.0.0.1", echo_port), closed_once)
        reader, writer = await pipe.open()
        writer.write(MESSAGE)
        await writer.drain()
        echoed = await asyncio.wait_for(reader.readexactly(len(MESSAGE)), timeout=30)
        writer.close()
        await writer.wait_closed()
        pipe.close()
        pipe.close()  # a second close changes nothing
        return echoed

    assert asyncio.run(talk()) == MESSAGE
    assert closed == [True]
    assert ssh.in_use == in_use_before


def test_a_port_nobody_listens_on_is_an_ssh_error(ssh: SSHConnection) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        free_port = probe.getsockname()[1]
    with pytest.raises(SSHError, match="could not reach"):
        ssh.open_tunnel("127.0.0.1", free_port)

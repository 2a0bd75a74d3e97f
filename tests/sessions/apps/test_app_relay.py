"""The relay between a tcp app's route (a Unix socket in the private folder) and its port in its
own network is a plain byte stream both ways, for many connections at once: what goes in
through the gate comes back from an echo server byte for byte, a half-close passing through."""

from __future__ import annotations

import hashlib
import os
import socket
import textwrap
from concurrent.futures import ThreadPoolExecutor

from sessions_app.proxy import gate
from tests.sessions.apps.conftest import NODE_PYTHON, AppRunner

# Echoes each connection's bytes as they come, and closes once the client has said all.
ECHO = (
    textwrap.dedent(
        """
    import socketserver, sys

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            while True:
                data = self.request.recv(65536)
                if not data:
                    break
                self.request.sendall(data)

    socketserver.ThreadingTCPServer.daemon_threads = True
    socketserver.ThreadingTCPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
    """
    )
    .replace("{", "{{")
    .replace("}", "}}")
)
CONNECTIONS = 16
EACH = 2 * 1024 * 1024


def test_many_connections_carry_their_bytes_both_ways_through_a_tcp_apps_relay(
    apps: AppRunner,
) -> None:
    run = apps.launch(
        {
            "name": "echo",
            "command": [NODE_PYTHON, "-c", ECHO, "{port}"],
            "env": {},
            "reach": "tcp",
            "values": {},
            "base_url": "/s/apptest/",
            "start_timeout": 30,
        }
    )
    assert run.report.get("ready"), run.report

    def round_trip(_: int) -> tuple[str, str]:
        sent = os.urandom(EACH)
        with socket.create_connection(("127.0.0.1", run.report["port"]), timeout=60) as channel:
            gate.open_blocking(channel, run.secret, "http")  # type: ignore[arg-type]
            back = bytearray()

            def read() -> None:
                while data := channel.recv(65536):
                    back.extend(data)

            with ThreadPoolExecutor(1) as reader:
                reading = reader.submit(read)
                channel.sendall(sent)
                channel.shutdown(socket.SHUT_WR)
                reading.result(timeout=60)
        return hashlib.sha256(sent).hexdigest(), hashlib.sha256(back).hexdigest()

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        results = list(pool.map(round_trip, range(CONNECTIONS)))
    assert all(sent == back for sent, back in results)

"""Session kinds come from one registry: the API, the pages and the launcher ask it, and a
kind's node starter runs inside the common launcher exactly as the platform sends them."""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from node import STARTERS_PATH as STARTERS
from sessions_app import kinds
from sessions_app.launch import BOOTSTRAP, LAUNCHER
from sessions_app.proxy import gate
from tests.sessions.test_session_rules import api, connected_worker

pytestmark = pytest.mark.django_db


def test_the_api_lists_every_registered_kind_and_only_to_a_known_user(user: Any) -> None:
    listed = api(user).get("/api/sessions/kinds/")
    assert listed.status_code == 200
    assert [k["name"] for k in listed.json()] == kinds.names()
    assert {"desktop", "vscode"} <= set(kinds.names())
    for kind in listed.json():
        # The built-in kinds take no values (an operator's app lists its fields).
        assert set(kind) == {"name", "label", "description", "fields"} and kind["fields"] == []
        assert kind["name"] and kind["label"] and kind["description"]
    assert APIClient().get("/api/sessions/kinds/").status_code == 401


def test_a_type_the_registry_does_not_know_is_refused_naming_the_known_ones(user: Any) -> None:
    answer = api(user).post(
        "/api/sessions/", {"type": "emacs", "cluster": "c", "worker": "w"}, format="json"
    )
    assert answer.status_code == 400
    assert answer.json()["field"] == "type"


def test_the_sessions_page_offers_a_launch_button_per_kind(user: Any, client: Any) -> None:
    connected_worker(user)
    client.force_login(user)
    page = client.get("/sessions/").content.decode()
    for kind in kinds.all_kinds():
        assert f'name="type" value="{kind.name}"' in page
        assert f'<option value="{kind.name}"' in page
        assert kind.label in page


def test_every_kind_has_a_node_starter_with_a_start_function() -> None:
    for kind in kinds.all_kinds():
        tree = ast.parse((STARTERS / f"{kind.name}.py").read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert [a.arg for a in functions["start"].args.args] == [
            "launcher",
            "secret",
            "options",
        ], kind.name
        assert 0 < kind.secret_length <= 32


# A starter as small as one can be: a web server in its own process on the route's Unix socket.
ECHO_STARTER = textwrap.dedent(
    """
    import sys

    SERVE = (
        "import http.server, socketserver, sys, functools\\n"
        "class H(http.server.SimpleHTTPRequestHandler):\\n"
        "    def address_string(self): return 'gate'\\n"
        "socketserver.UnixStreamServer(sys.argv[1], functools.partial(H, directory=sys.argv[2]))"
        ".serve_forever()"
    )

    def start(launcher, secret, options):
        with open(launcher.workdir + "/index.html", "w") as page:
            page.write(options["--greeting"] + " " + secret)
        launcher.start([sys.executable, "-c", SERVE, launcher.route("http"), launcher.workdir])
    """
)


def launched(secret: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    launcher = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, "echo", "--greeting", "hello"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdin is not None and launcher.stdout is not None
    launcher.stdin.write(secret + "\n" + LAUNCHER + "\0" + ECHO_STARTER)
    launcher.stdin.close()
    return launcher, json.loads(launcher.stdout.readline())


def through_gate(port: int, secret: str, route: str = "http") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        gate.open_blocking(connection, secret, route)  # type: ignore[arg-type]
        connection.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
        return b"".join(iter(lambda: connection.recv(65536), b""))


def test_the_launcher_runs_a_starter_sent_after_it_and_ends_its_program_on_sigterm() -> None:
    # Given: the launcher started as the platform starts it (password, launcher, NUL, starter).
    launcher, report = launched("s3cret")
    try:
        # When: it reports ready. Then: the starter's program answers behind the gate.
        assert report["ready"] is True and report["pid"] == launcher.pid
        assert through_gate(report["port"], "s3cret").endswith(b"hello s3cret")
        # And: SIGTERM to the launcher ends the program with it.
        os.kill(launcher.pid, signal.SIGTERM)
        assert launcher.wait(timeout=15) == 0
        time.sleep(0.2)
        with pytest.raises(OSError):
            through_gate(report["port"], "s3cret")
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_the_gate_passes_nothing_without_the_sessions_key_and_nothing_it_says_is_reusable() -> None:
    launcher, report = launched("s3cret")
    try:
        port = report["port"]
        # A client with another key is refused: the gate closes before any byte of the program.
        with pytest.raises(gate.GateRefused):
            through_gate(port, "guess")
        # A client that only speaks HTTP gets the greeting (a fresh nonce) and nothing else.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            heard = b"".join(iter(lambda: plain.recv(65536), b""))
        assert heard.startswith(b"ACTIVATE-GATE 1 ") and b"hello" not in heard
        # A proof the platform sent once (captured by whoever sat on the port) opens nothing:
        # the gate's next nonce is another.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
            handshake = gate.Handshake("s3cret", "http")
            captured = handshake.reply(first.recv(100))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as replay:
            replay.recv(100)
            replay.sendall(captured)
            assert replay.recv(100) == b""
        # An unknown route is refused like a wrong key.
        with pytest.raises(gate.GateRefused):
            through_gate(port, "s3cret", route="vnc")
        assert through_gate(port, "s3cret").endswith(b"hello s3cret")
    finally:
        # SIGTERM: the launcher ends its program with it (SIGKILL would leave it serving).
        launcher.terminate()
        launcher.wait(timeout=15)


def test_the_platform_sends_nothing_past_the_handshake_to_what_is_not_the_gate() -> None:
    # Given: a neighbour listening where the session's launcher was, speaking its greeting.
    listener = socket.create_server(("127.0.0.1", 0))
    heard: list[bytes] = []

    def neighbour() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"ACTIVATE-GATE 1 " + b"0" * 32 + b"\n")
            connection.settimeout(3)
            heard.append(connection.recv(1000))
            connection.sendall(b"OK " + b"f" * 64 + b"\n")
            try:
                while data := connection.recv(1000):
                    heard.append(data)
            except OSError:
                pass

    thread = threading.Thread(target=neighbour)
    thread.start()
    # When: the platform opens the session there. Then: refused, and no request was sent.
    with pytest.raises(gate.GateRefused):
        through_gate(listener.getsockname()[1], "s3cret")
    thread.join(10)
    assert len(heard) == 1 and heard[0].startswith(b"http ") and b"s3cret" not in heard[0]


def test_a_launch_without_a_starter_says_so_in_its_report() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, "nothing"],
        input="s3cret\n" + LAUNCHER + "\0",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout) == {"error": "no starter came for session type 'nothing'"}

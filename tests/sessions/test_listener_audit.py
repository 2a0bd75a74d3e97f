"""The listener audit's own workings, on real processes of this machine: a TCP listener planted
next to a session's gate is named with its port and command line; the gate, listeners outside
the session and a real ipykernel's receive-only output pipe are not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.waiting import wait_for
from tests.sessions.listener_audit import (
    Listener,
    report,
    tcp_listeners,
    unexpected,
    zmq_socket_type,
)
from tests.sessions.test_neighbour_jupyter_kernels import KERNEL_PYTHON

GATE = (
    "import socket, sys, time\n"
    "gate = socket.create_server(('127.0.0.1', 0))\n"
    "print(gate.getsockname()[1], flush=True)\n"
    "time.sleep(300)\n"
)


def listening(pid: int) -> list[Listener]:
    return [found for found in tcp_listeners(os.getuid()) if found.pid == pid]


@pytest.fixture
def http_server() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """``python3 -m http.server`` on a free port of an address, as the owner would start it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(address: str) -> subprocess.Popen[bytes]:
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "0", "--bind", address],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(server)
        wait_for(lambda: listening(server.pid), timeout=30)
        return server

    yield start
    for server in started:
        server.kill()
        server.wait()


def test_the_audit_names_a_listener_planted_beside_the_gate_and_only_it(
    http_server: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    # Given: a session's gate (a listener of this process's), a server planted in the session,
    # and the same server of the same uid outside it (on IPv6).
    # The gate is a process of its own: this one may hold other tests' listeners.
    planted, outsider = http_server("127.0.0.1"), http_server("::1")
    gate = subprocess.Popen(
        [sys.executable, "-c", GATE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert gate.stdout is not None
        gate_port = int(gate.stdout.readline())
        session = {gate.pid, planted.pid}
        # When: the audit looks at the session's listeners, told apart by the holding pid.
        listeners = tcp_listeners(os.getuid())
        found = unexpected(
            listeners, gate_port=gate_port, in_session=lambda listener: listener.pid in session
        )
        printed = report(found)
        print(printed)
    finally:
        gate.kill()
        gate.wait()
    # Then: it names the planted server, with its address, port and command line ...
    (server,) = listening(planted.pid)
    assert found == [server]
    assert f"127.0.0.1:{server.port} " in printed and "-m http.server 0 --bind 127.0.0.1" in printed
    # ... and it saw the gate and the outsider, and let them be.
    seen = {(listener.address, listener.port, listener.pid) for listener in listeners}
    assert ("127.0.0.1", gate_port, gate.pid) in seen
    assert ("::1", listening(outsider.pid)[0].port, outsider.pid) in seen
    # And: the planted server is no ZMQ socket (it could not pass for a kernel's pipe).
    assert zmq_socket_type(server.port) is None


@pytest.mark.live
def test_a_real_kernels_only_tcp_listener_is_its_receive_only_output_pipe(tmp_path: Path) -> None:
    # Given: a real ipykernel on the ipc transport, as the Jupyter starter runs them.
    connection = tmp_path / "kernel-audit.json"
    ip = str(tmp_path / "kernel-audit-ipc")
    ports = {f"{name}_port": n for n, name in enumerate(("shell", "iopub", "stdin", "hb"), 1)}
    info = {**ports, "control_port": 5, "ip": ip, "transport": "ipc", "key": os.urandom(16).hex()}
    connection.write_text(json.dumps({**info, "signature_scheme": "hmac-sha256"}))
    kernel = subprocess.Popen(
        [KERNEL_PYTHON, "-m", "ipykernel_launcher", "-f", str(connection)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: Path(f"{ip}-2").exists() and listening(kernel.pid), timeout=60)
        time.sleep(1)  # every socket bound
        # When: the audit looks at its listeners.
        (pipe,) = listening(kernel.pid)
        # Then: the one TCP listener says it is a ZMQ PULL socket, and the audit lets it be.
        assert pipe.address == "127.0.0.1" and "ipykernel_launcher" in pipe.argv
        assert zmq_socket_type(pipe.port) == "PULL"
        assert unexpected([pipe], gate_port=0, in_session=lambda _: True) == []
    finally:
        kernel.kill()
        kernel.wait()

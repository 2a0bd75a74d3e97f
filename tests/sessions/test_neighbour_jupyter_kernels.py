"""A Jupyter kernel's output goes to its owner only. A kernel's IOPub channel is a ZMQ PUB socket:
whoever subscribes gets every message, signed or not. On TCP (Jupyter's default, five ports on
127.0.0.1) any user of the node could subscribe; on ipc its sockets are files in the session's
private (0700) folder, and the OS refuses the neighbour. The neighbour is the test cluster's
second account (pwbob), an ordinary Unix user. Real Slurm over real SSH."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from websockets.sync.client import ClientConnection, connect

from harness.cluster import SshTarget
from harness.platform import Platform
from tests.processes import args_of, descendants
from tests.sessions.listener_audit import report, unexpected
from tests.sessions.listener_audit import tcp_listeners as owners_listeners
from tests.sessions.test_jupyter_neighbour import argument, running_jupyter, unix_connect
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]
# The kernels' Python (JupyterLab's environment on the test node), which has pyzmq.
KERNEL_PYTHON = "/var/cache/activate/jupyter/4.6.6/bin/python3"

# The neighbour: subscribes to everything on every TCP port the owner's uid listens on (as
# /proc/net/tcp shows any user) for a few seconds, and says what it heard.
SUBSCRIBE = """
import json, zmq

owner, canary = {owner}, {canary!r}
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[7]) == owner:
            ports.add((table.endswith("6"), int(fields[1].rsplit(":", 1)[1], 16)))
context = zmq.Context()
poller = zmq.Poller()
subscribed = {{}}
for six, port in ports:
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.IPV6, int(six))
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("tcp://%s:%d" % ("[::1]" if six else "127.0.0.1", port))
    poller.register(sub, zmq.POLLIN)
    subscribed[sub] = port
heard = {{}}
for _ in range(50):
    for sub, _ in poller.poll(100):
        frames = sub.recv_multipart()
        if any(canary.encode() in frame for frame in frames):
            heard[subscribed[sub]] = heard.get(subscribed[sub], 0) + 1
print(json.dumps({{"ports": sorted(p for _, p in ports), "canary": heard}}))
"""


def execute_request(code: str) -> tuple[str, str]:
    """A Jupyter execute_request on the shell channel, as JupyterLab sends it over WebSocket."""
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "alice",
        "session": uuid.uuid4().hex,
        "date": datetime.now(UTC).isoformat(),
        "version": "5.3",
    }
    content = {
        "code": code,
        "silent": False,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
    return msg_id, json.dumps({**message, "channel": "shell", "buffers": []})


def kernel_channel(session: dict[str, Any], key: str) -> tuple[str, ClientConnection]:
    """A kernel started through the platform with the owner's API key, and its WebSocket."""
    kernel = httpx.post(
        session["url"] + "api/kernels",
        json={"name": "python3"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert kernel.status_code == 201, kernel.text
    kernel_id = kernel.json()["id"]
    url = session["url"].replace("http://", "ws://", 1)
    ws = connect(
        f"{url}api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}",
        additional_headers={"Authorization": f"Bearer {key}"},
        max_size=None,
    )
    return kernel_id, ws


def printed(ws: ClientConnection, msg_id: str, needle: str, within: float = 90) -> str:
    """The first stream output of ``msg_id`` that holds ``needle``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "error":
            raise AssertionError(message["content"])
        if message["msg_type"] == "stream" and needle in message["content"]["text"]:
            return str(message["content"]["text"])
    raise AssertionError(f"no output holding {needle!r} within {within} s")


def canary_cell(canary: str, seconds: int = 60) -> str:
    """A cell that prints ``canary`` four times a second for ``seconds``."""
    return textwrap.dedent(
        f"""
        import time
        for _ in range({seconds * 4}):
            print({canary!r}, flush=True)
            time.sleep(0.25)
        """
    )


# Alone: its neighbour subscribes to every TCP port listening on the machine, srun's I/O ports
# among them, and an srun whose port gets a ZMQ greeting ends ("Insane message length"): a
# session starting meanwhile in another test failed so.
@pytest.mark.serial
def test_a_neighbour_subscribing_to_the_owners_tcp_ports_hears_nothing_of_her_kernel(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    owner_uid = int(subprocess.run(["id", "-u", owner], capture_output=True, text=True).stdout)
    # Given: alice's JupyterLab on the node, and a kernel of hers printing a canary (started
    # and driven through the platform, as her browser does).
    session, servers = running_jupyter(pw, owner)
    state = session_state(session["id"])
    _, key = ApiKey.issue(alice)
    canary = f"CANARY-{uuid.uuid4().hex[:12]}"
    _, ws = kernel_channel(session, key)
    with ws:
        msg_id, request = execute_request(canary_cell(canary))
        ws.send(request)
        assert canary in printed(ws, msg_id, canary)

        # When: the neighbour subscribes to every TCP port her uid listens on.
        subscribe = textwrap.dedent(SUBSCRIBE.format(owner=owner_uid, canary=canary))
        heard = subprocess.run(
            ["runuser", "-u", neighbour, "--", KERNEL_PYTHON, "-c", subscribe],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert heard.returncode == 0, heard.stderr
        result = json.loads(heard.stdout)
        print(f"the neighbour subscribed to {result['ports']} and heard {result['canary']}")
        # Then: it hears none of her kernel's output ...
        assert result["canary"] == {}, result
        # ... because her session listens on no TCP port but the launcher's gate, and the
        # kernel's pipe for its subprocesses' output (ipykernel binds it to 127.0.0.1, with no
        # option): a ZMQ PULL socket, which sends nothing.
        programs = descendants(state.node_pid or 0)
        session_pids = {state.node_pid, *programs}
        listeners = [found for found in owners_listeners(owner_uid) if found.pid in session_pids]
        print("her session listens on:\n" + report(listeners))
        assert {found.port for found in listeners} <= set(result["ports"])  # it tried each
        others = unexpected(listeners, gate_port=state.node_port or 0, in_session=lambda _: True)
        assert others == [], report(others)
        assert state.node_port in {found.port for found in listeners}

        # And: her kernel's connection file and sockets are in the session's private folder,
        # closed to the neighbour by the OS, open to her.
        private = os.path.dirname(argument(servers[0], "--ServerApp.sock="))
        kernel = next(args_of(pid) for pid in programs if "ipykernel_launcher" in args_of(pid))
        connection_file = Path(kernel[kernel.index("-f") + 1])
        info = json.loads(connection_file.read_text())
        assert connection_file.parent == Path(private) and info["transport"] == "ipc", info
        assert info["ip"].startswith(private + "/"), info
        iopub = f"{info['ip']}-{info['iopub_port']}"
        assert unix_connect(neighbour, iopub) == "PermissionError"
        assert unix_connect(owner, iopub) == "connected"
        # And: her cell still runs, its output still reaching her through the platform.
        assert canary in printed(ws, msg_id, canary)
    pw("sessions", "stop", session["id"])

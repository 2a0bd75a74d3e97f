"""A desktop and VS Code give another ordinary Unix user on the same node nothing: no X display,
no VNC server, no code-server, only the launcher's gate, which passes nothing without the
session's key. The neighbour is the test cluster's second account, acting through `runuser`,
never root: the X server and the OS refuse. Real Slurm over real SSH."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from tests.processes import args_of, descendants
from tests.sessions.test_jupyter_neighbour import as_user, plain_http, unix_connect
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
# An X11 connection setup with no authorization (little-endian, protocol 11.0).
X11_SETUP = b"l\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00"


def tcp_listeners(pids: list[int]) -> set[int]:
    """The TCP ports these processes listen on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & set(pids):
            ports.add(int(line.split()[3].rsplit(":", 1)[1]))
    return ports


def x11_answer(user: str, display: int) -> list[int]:
    """The first byte of the X server's answer to ``user``'s setup without a cookie (0 refused,
    1 accepted), on the display's file socket and on its abstract one."""
    probe = as_user(
        user,
        f"""
        import socket
        for address in ("/tmp/.X11-unix/X{display}", "\\0/tmp/.X11-unix/X{display}"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(address)
            s.sendall({X11_SETUP!r})
            print(s.recv(1)[0])
        """,
    )
    assert probe.returncode == 0, probe.stderr
    return [int(line) for line in probe.stdout.split()]


def opened(session: dict[str, Any], alice: User, path: str) -> httpx.Response:  # noqa: F811
    _, key = ApiKey.issue(alice)
    return httpx.get(
        session["url"] + path,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        follow_redirects=True,
    )


def test_a_neighbour_can_neither_open_the_desktops_display_nor_reach_its_vnc_server(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    # Given: alice's desktop running on the node as her cluster account.
    session, _ = created(pw, "--type", "desktop", "sessions", "--environment", "compute")
    state = session_state(session["id"])
    programs = descendants(state.node_pid)
    xvnc = next(
        pid for pid in programs if "Xtigervnc" in args_of(pid)[0] or "Xvnc" in args_of(pid)[0]
    )
    args = args_of(xvnc)
    display = int(args[1].lstrip(":"))
    vnc_socket = args[args.index("-rfbunixpath") + 1]

    # When: the neighbour opens an X11 connection to her display. Then: the X server refuses.
    assert x11_answer(neighbour, display) == [0, 0]
    # When: the neighbour looks for her VNC server. Then: nothing of the session listens on
    # TCP but the launcher's gate, which only greets; the VNC socket's folder is closed to him.
    assert tcp_listeners([state.node_pid, *programs]) == {state.node_port}
    heard = plain_http(neighbour, state.node_host, state.node_port, "/vnc.html")
    assert heard.startswith("ACTIVATE-GATE 1 ") and "RFB" not in heard and "HTTP/" not in heard
    assert unix_connect(neighbour, vnc_socket) == "PermissionError"
    assert unix_connect(owner, vnc_socket) == "connected"
    # And: the desktop still opens for her through the platform.
    assert opened(session, alice, "vnc.html").status_code == 200
    pw("sessions", "stop", session["id"])


def test_a_neighbour_cannot_reach_code_server_and_the_owners_session_still_opens(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    session, _ = created(pw, "--type", "vscode", "sessions", "--environment", "compute")
    state = session_state(session["id"])
    programs = descendants(state.node_pid)
    server = next(pid for pid in programs if "--socket" in args_of(pid))
    args = args_of(server)
    code_socket = args[args.index("--socket") + 1]

    assert tcp_listeners([state.node_pid, *programs]) == {state.node_port}
    heard = plain_http(neighbour, state.node_host, state.node_port, "/")
    assert heard.startswith("ACTIVATE-GATE 1 ") and "HTTP/" not in heard
    assert unix_connect(neighbour, code_socket) == "PermissionError"
    assert unix_connect(owner, code_socket) == "connected"
    page = opened(session, alice, "")
    assert page.status_code == 200 and "code-server" in page.text.lower(), page.text[:300]
    pw("sessions", "stop", session["id"])

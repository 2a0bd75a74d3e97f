"""What a Jupyter session gives another ordinary Unix user on the same node: nothing. The
neighbour is the test cluster's second account (pwbob), acting through `runuser`, never root:
the OS and Jupyter Server refuse, not the platform's code. Real Slurm over real SSH."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]
# The node's own Python: the platform's virtual environment is not the neighbour's to run.
NODE_PYTHON = "/usr/bin/python3"
BOBS_ANSWER = "HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\n\\r\\nbob's!"


def as_user(user: str, code: str, *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", NODE_PYTHON, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def processes_of(user: str, needle: str) -> list[int]:
    uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid and needle in (entry / "cmdline").read_bytes().decode():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def running_jupyter(pw: Any, owner: str) -> tuple[dict[str, Any], list[int]]:  # noqa: F811
    """Alice's JupyterLab running on the node as her cluster account, and its server's pids."""
    session, _ = created(pw, "--type", "jupyter", "sessions", "--environment", "compute")
    port = session_state(session["id"]).node_port
    servers = processes_of(owner, f"--ServerApp.port={port}")
    assert servers, f"no JupyterLab process of {owner} on port {port}"
    return session, servers


def test_a_neighbour_on_the_node_gets_nothing_from_a_running_jupyter_session(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    # Given: alice's JupyterLab running on the node as her cluster account.
    session, servers = running_jupyter(pw, owner)
    state = session_state(session["id"])
    host, port, token = state.node_host, state.node_port, state.secret()
    path = f"/s/{session['id']}/"

    # When: the neighbour calls the server directly, without its token.
    probe = as_user(
        neighbour,
        f"""
        import http.client
        for path in ("{path}api/status", "{path}api/kernels", "{path}api/contents"):
            c = http.client.HTTPConnection("{host}", {port}, timeout=10)
            c.request("GET", path)
            print(path, c.getresponse().status)
        """,
    )
    # Then: Jupyter Server refuses every call.
    assert probe.returncode == 0, probe.stderr
    statuses = [int(line.rsplit(" ", 1)[1]) for line in probe.stdout.splitlines()]
    assert len(statuses) == 3 and all(status == 403 for status in statuses), probe.stdout

    # When: the neighbour looks for the token where it lives: the server's environment, its
    # command line, and the owner's Jupyter runtime files.
    runtime = [
        str(found)
        for home in (Path(os.path.expanduser(f"~{owner}")),)
        for found in home.glob(".local/share/jupyter/runtime/jpserver-*.json")
    ]
    assert runtime, "JupyterLab wrote no runtime file where the test looks"
    looked = as_user(
        neighbour,
        f"""
        for path in {[f"/proc/{pid}/environ" for pid in servers] + runtime!r}:
            try:
                open(path, "rb").read()
                print("READ", path)
            except PermissionError:
                print("refused", path)
        for pid in {servers!r}:
            print("cmdline", open("/proc/%d/cmdline" % pid, "rb").read().decode())
        """,
    )
    # Then: the OS refuses to show the environment and the files, and no command line holds it.
    assert looked.returncode == 0, looked.stderr
    assert "READ" not in looked.stdout, looked.stdout
    assert looked.stdout.count("refused") == len(servers) + len(runtime)
    assert token not in looked.stdout
    pw("sessions", "stop", session["id"])


@pytest.mark.xfail(
    strict=True,
    reason="issue 22: the proxy does not check who answers on the node's port, so a neighbour "
    "who binds it after the program died receives the next request, its token included",
)
def test_a_neighbour_who_takes_a_dead_jupyters_port_receives_none_of_the_owners_requests(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    session, servers = running_jupyter(pw, owner)
    port = session_state(session["id"]).node_port

    # When: the server dies (as a crash would) and the neighbour listens on its port at once,
    # logging whatever arrives.
    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    catch = Path(f"/tmp/neighbour-catch-{session['id']}")
    catch.unlink(missing_ok=True)
    listener = subprocess.Popen(
        [
            "runuser",
            "-u",
            neighbour,
            "--",
            NODE_PYTHON,
            "-c",
            textwrap.dedent(
                f"""
                import socket, time
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                deadline = time.monotonic() + 20
                while True:
                    try:
                        s.bind(("0.0.0.0", {port}))
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
                s.listen(16)
                print("listening", flush=True)
                s.settimeout(1)
                with open("{catch}", "ab", buffering=0) as out:
                    while True:
                        try:
                            conn, _ = s.accept()
                        except socket.timeout:
                            continue
                        conn.settimeout(2)
                        try:
                            out.write(conn.recv(65536) or b"")
                            conn.sendall(b"{BOBS_ANSWER}")
                        except OSError:
                            pass
                        conn.close()
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # runuser's child is killed with it, as a group
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "listening"
        # Then: none of alice's requests over the next seconds reaches the neighbour's program,
        # and the session ends.
        _, key = ApiKey.issue(alice)
        answers = []
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            for _ in range(10):
                answers.append(client.get(session["url"] + "api/status"))
                time.sleep(0.5)
        caught = catch.read_bytes() if catch.exists() else b""
        assert caught == b"", caught[:500]
        assert all(answer.status_code != 200 for answer in answers), [
            (a.status_code, a.text[:80]) for a in answers
        ]
        assert all("bob's!" not in answer.text for answer in answers)
        wait_for(lambda: session_state(session["id"]).status in ("ended", "failed"), timeout=30)
    finally:
        os.killpg(listener.pid, signal.SIGKILL)
        listener.wait()
        catch.unlink(missing_ok=True)
        pw("sessions", "stop", session["id"])

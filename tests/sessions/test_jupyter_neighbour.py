"""What a Jupyter session gives another ordinary Unix user on the same node: nothing. The
neighbour is the test cluster's second account (pwbob), acting through `runuser`, never root:
the OS and the launcher's gate refuse, not the platform's code. Real Slurm over real SSH."""

from __future__ import annotations

import contextlib
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
# The node's own Python: the platform's virtual environment is not the neighbour's to run.
NODE_PYTHON = "/usr/bin/python3"
BOBS_ANSWER = "HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\n\\r\\nbob's!"
# What a neighbour who knows the launcher's protocol says first, in its place.
FAKE_GREETING = "ACTIVATE-GATE 1 " + "0" * 32 + "\\n"


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


def argument(pid: int, prefix: str) -> str:
    """The value of a process's ``prefix``-ed argument (``--ServerApp.sock=``, ...)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return next(arg[len(prefix) :] for arg in args if arg.startswith(prefix))


def running_jupyter(pw: Any, owner: str) -> tuple[dict[str, Any], list[int]]:  # noqa: F811
    """Alice's JupyterLab running on the node as her cluster account, and its server's pids."""
    session, _ = created(pw, "--type", "jupyter", "sessions", "--environment", "compute")
    servers = processes_of(owner, f"--ServerApp.base_url=/s/{session['id']}/")
    assert servers, f"no JupyterLab process of {owner} for session {session['id']}"
    return session, servers


def plain_http(user: str, host: str, port: int, path: str) -> str:
    """What ``user`` gets asking the session's port for ``path`` in plain HTTP."""
    probe = as_user(
        user,
        f"""
        import socket
        c = socket.create_connection(("{host}", {port}), timeout=10)
        c.sendall(b"GET {path} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        heard = b""
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                heard += data
        except OSError:
            pass
        print(heard.decode("latin-1"))
        """,
    )
    assert probe.returncode == 0, probe.stderr
    return probe.stdout


def unix_connect(user: str, path: str) -> str:
    """``connected`` or the error ``user`` gets connecting to the Unix socket ``path``."""
    probe = as_user(
        user,
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({path!r})
            print("connected")
        except OSError as exc:
            print(type(exc).__name__)
        """,
    )
    assert probe.returncode == 0, probe.stderr
    return probe.stdout.strip()


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

    # When: the neighbour calls the session's port on the node directly, without its key.
    heard = plain_http(neighbour, host, port, f"{path}api/status")
    # Then: only the launcher's gate answers (a greeting with a fresh nonce), and closes.
    assert heard.startswith("ACTIVATE-GATE 1 ") and "HTTP/" not in heard, heard[:300]
    # When: the neighbour goes to the server's own socket. Then: the OS refuses (0700 folder).
    socket_path = argument(servers[0], "--ServerApp.sock=")
    assert unix_connect(neighbour, socket_path) == "PermissionError"
    assert unix_connect(owner, socket_path) == "connected"
    # And: the owner still gets her server through the platform.
    _, key = ApiKey.issue(alice)
    status = httpx.get(
        session["url"] + "api/status", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert status.status_code == 200, status.text[:300]

    # When: the neighbour looks for the token where it lives: the server's environment, its
    # command line, and the server's runtime files (in the session's private folder).
    runtime = [str(found) for found in Path(socket_path).parent.glob("jpserver-*.json")]
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


@pytest.mark.parametrize("killed", ["program", "launcher"])
def test_a_neighbour_who_takes_a_dead_sessions_port_receives_none_of_the_owners_requests(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
    killed: str,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    session, servers = running_jupyter(pw, owner)
    state = session_state(session["id"])
    port, token = state.node_port, state.secret()

    # When: the server (or, separately, the launcher watching it) dies as a crash would, and
    # the neighbour listens on the session's port at once, speaking the launcher's greeting
    # and logging whatever arrives.
    victims = servers if killed == "program" else [state.node_pid]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    died = time.monotonic()
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
                # The gate's port lingers in TIME_WAIT (its listener did not ask for reuse):
                # the OS keeps it from the neighbour for up to a minute.
                deadline = time.monotonic() + 90
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
                            conn.sendall(b"{FAKE_GREETING}")
                            out.write(conn.recv(65536) or b"")
                            conn.sendall(b"OK " + b"f" * 64 + b"\\n")
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
        _, key = ApiKey.issue(alice)
        answers = []
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            # Then: alice's requests meanwhile end the session, with its reason, within 10 s.
            while time.monotonic() - died < 10:
                answers.append(client.get(session["url"] + "api/status"))
                if session_state(session["id"]).status in ("ended", "failed"):
                    break
                time.sleep(0.5)
            ended = session_state(session["id"])
            assert ended.status in ("ended", "failed"), (ended.status, answers[-1].text[:200])
            assert "program" in ended.status_reason
            print(f"session ended {time.monotonic() - died:.1f} s after the {killed} died")
            # And: once the neighbour holds the port, none of her requests reaches it: it
            # hears at most the platform's half of a handshake, bound to its own nonce.
            assert listener.stdout.readline().strip() == "listening"
            for _ in range(5):
                answers.append(client.get(session["url"] + "api/status"))
                time.sleep(0.5)
        caught = catch.read_bytes() if catch.exists() else b""
        for line in caught.decode("latin-1").splitlines():
            assert line.startswith("http ") and len(line.split()) == 3, caught[:500]
        assert token.encode() not in caught and b"api/status" not in caught
        assert all(answer.status_code != 200 for answer in answers), [
            (a.status_code, a.text[:80]) for a in answers
        ]
        assert all("bob's!" not in answer.text for answer in answers)
    finally:
        os.killpg(listener.pid, signal.SIGKILL)
        listener.wait()
        catch.unlink(missing_ok=True)
        pw("sessions", "stop", session["id"])
        # With its launcher killed the server is an orphan the test node's Slurm does not track
        # (proctrack/linuxproc): it would outlive the job.
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

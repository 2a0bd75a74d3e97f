"""An operator's app whose program cannot start ends the session with the program's last lines,
which the platform shows its owner as the session's reason: one that exits at once, one that
never listens (within its start timeout), a definition with {secret} on the command line, and
a node that refuses user namespaces to an app reached over TCP. Nothing of theirs is left
running (the fixture checks); a definition refused starts nothing (tests/node/)."""

from __future__ import annotations

import hashlib
import json
import textwrap

import pytest

from tests.sessions.apps.conftest import NODE_PYTHON, AppRunner

EXITS = textwrap.dedent(
    """
    import sys
    print("starting up", flush=True)
    print("error: the log folder %s does not exist" % sys.argv[1], file=sys.stderr)
    sys.exit(3)
    """
)
NEVER_LISTENS = textwrap.dedent(
    """
    import time
    print("loading a very large model", flush=True)
    time.sleep(600)
    """
)
# A web server on the Unix socket it is told, its page the hash of its password file.
UNIX_SERVER = textwrap.dedent(
    """
    import hashlib, http.server, socketserver, sys

    body = hashlib.sha256(open(sys.argv[2]).read().encode()).hexdigest().encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def address_string(self):
            return "gate"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    socketserver.UnixStreamServer(sys.argv[1], Page).serve_forever()
    """
)


def app(command: list[str], reach: str = "tcp", start_timeout: int = 30) -> dict[str, object]:
    return {
        "name": "demo",
        "command": command,
        "env": {},
        "reach": reach,
        "values": {"logdir": "/nope"},
        "base_url": "/s/apptest/",
        "start_timeout": start_timeout,
    }


@pytest.mark.parametrize(("reach", "where"), [("tcp", "port"), ("unix", "socket")])
def test_a_program_that_exits_at_once_fails_the_session_with_its_last_lines(
    apps: AppRunner, reach: str, where: str
) -> None:
    run = apps.launch(app([NODE_PYTHON, "-c", EXITS, "{logdir}", f"{{{where}}}"], reach))
    print(f"failed {run.took:.2f} s after the launcher started: {run.report}")
    assert run.report == {
        "error": f"demo exited with status 3 before it listened on its {where}; its last "
        "lines:\nstarting up\nerror: the log folder /nope does not exist"
    }
    assert run.launcher.wait(timeout=30) == 1


def test_a_program_that_never_listens_fails_at_its_start_timeout_with_its_last_lines(
    apps: AppRunner,
) -> None:
    run = apps.launch(app([NODE_PYTHON, "-c", NEVER_LISTENS, "{port}"], start_timeout=3))
    print(f"failed {run.took:.2f} s after the launcher started: {run.report}")
    assert run.report == {
        "error": "demo did not listen on its port within 3 s; its last lines:\n"
        "loading a very large model"
    }
    assert 3 <= run.took < 15
    assert run.launcher.wait(timeout=30) == 1


def test_the_secret_on_a_command_line_is_refused_before_anything_starts(
    apps: AppRunner,
) -> None:
    run = apps.launch(app([NODE_PYTHON, "--token={secret}", "{port}"]))
    assert run.report == {
        "error": "demo: its command may not hold {secret}, which every user of the node could "
        "read there; use {secret_file}, or {secret} in env"
    }
    assert run.launcher.wait(timeout=30) == 1


def test_a_unix_app_listens_on_its_socket_and_reads_its_password_from_its_file(
    apps: AppRunner,
) -> None:
    run = apps.launch(
        app([NODE_PYTHON, "-c", UNIX_SERVER, "{socket}", "{secret_file}"], reach="unix")
    )
    assert run.report.get("ready"), run.report
    status, body = run.request("/")
    assert (status, body.decode()) == (200, hashlib.sha256(run.secret.encode()).hexdigest())


# Run inside a user namespace of alice's whose limit on nested ones is 0: a node whose kernel
# refuses them (user.max_user_namespaces=0, or a distribution's switch).
NO_USER_NAMESPACES = (
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
    "sh",
)


def test_a_node_that_refuses_user_namespaces_fails_a_tcp_app_saying_so(
    apps: AppRunner,
) -> None:
    run = apps.launch(app([NODE_PYTHON, "-m", "http.server", "{port}"]), prefix=NO_USER_NAMESPACES)
    print(json.dumps(run.report))
    assert run.report == {
        "error": "demo listens on TCP, and this node does not let its users have a network of "
        "their own (user namespaces: [Errno 28] No space left on device), without which its "
        "port would be open to every user of the node"
    }

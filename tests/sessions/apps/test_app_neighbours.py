"""An operator's app that can only listen on TCP (reach: tcp) runs in a network of its own: the
owner reaches it through her session's gate, while for the neighbour (pwbob, an ordinary Unix
user, through `runuser`) nothing of it listens on any port of the node; and what the app is
given reaches its program verbatim, as its owner. The same program started plainly beside it
is open to the neighbour, and the listener audit names it: the checks would see a leak."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

from tests.processes import args_of
from tests.sessions.apps.conftest import NODE_PYTHON, AppRunner
from tests.sessions.listener_audit import _address, report, tcp_listeners, unexpected

# The app's program: a web server on 127.0.0.1:PORT whose page says what it was given and who
# it runs as; it leaves a file in the session's private folder. (Its braces doubled in the
# command, which is a template.)
SERVER_CODE = textwrap.dedent(
    """
    import hashlib, http.server, json, os, pwd, sys

    port = int(sys.argv[1])
    with open(os.path.join(os.environ["APP_WORKDIR"], "made-by-the-app"), "w") as made:
        made.write("hello")
    told = {
        "port": port,
        "argv": sys.argv[2:],
        "env": os.environ.get("APP_VALUE"),
        "token": hashlib.sha256(os.environ.get("APP_TOKEN", "").encode()).hexdigest(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "user": pwd.getpwuid(os.getuid()).pw_name,
    }
    body = json.dumps(told).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Page).serve_forever()
    """
)
SERVER = SERVER_CODE.replace("{", "{{").replace("}", "}}")
# What the neighbour tries: the program's port on the node's loopback (both families), and
# joining its network namespace.
KNOCK = textwrap.dedent(
    """
    import json, socket, sys

    port, pid = int(sys.argv[1]), int(sys.argv[2])
    tried = {}
    for host in ("127.0.0.1", "::1"):
        try:
            socket.create_connection((host, port), timeout=5).close()
            tried[host] = "connected"
        except OSError as exc:
            tried[host] = type(exc).__name__
    try:
        open("/proc/%d/ns/net" % pid).close()
        tried["namespace"] = "opened"
    except OSError as exc:
        tried["namespace"] = type(exc).__name__
    print(json.dumps(tried))
    """
)


def web_app(**overrides: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "name": "web",
        "command": [NODE_PYTHON, "-c", SERVER, "{port}", "--base={base_path}"],
        "env": {"APP_WORKDIR": "{workdir}", "APP_TOKEN": "{secret}"},
        "reach": "tcp",
        "values": {},
        "base_url": "/s/apptest/",
        "start_timeout": 30,
    }
    spec.update(overrides)
    return spec


def knock(apps: AppRunner, port: int, pid: int) -> dict[str, str]:
    done = apps.as_neighbour(KNOCK, str(port), str(pid))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def listens_in(pid: int, port: int) -> bool:
    """Whether the network namespace ``pid`` is in has a TCP listener on 127.0.0.1:port."""
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and _address(fields[1]) == ("127.0.0.1", port):
            return True
    return False


def test_a_tcp_apps_port_is_open_to_its_owner_through_the_gate_and_to_no_neighbour(
    apps: AppRunner,
) -> None:
    # Given: an app that listens on 127.0.0.1:{port}, started as alice.
    run = apps.launch(web_app())
    assert run.report.get("ready"), run.report
    print(f"ready {run.took:.2f} s after the launcher started")

    # When: the platform asks through the gate. Then: the program's page.
    status, body = run.request("/")
    assert status == 200
    told = json.loads(body)
    port, program = told["port"], run.program()
    assert hashlib.sha256(run.secret.encode()).hexdigest() == told["token"]

    # Then: it does listen on its port, in a network namespace of its own.
    assert listens_in(program, port)
    assert os.readlink(f"/proc/{program}/ns/net") != os.readlink("/proc/self/ns/net")
    # And: the node's own tables show the gate, and nothing else of the session's processes.
    processes = set(run.processes())

    def in_session(listener: object) -> bool:
        return getattr(listener, "pid", None) in processes

    mine = [found for found in tcp_listeners(apps.owner_uid) if in_session(found)]
    print("the session's TCP listeners on the node:", [f"{x.address}:{x.port}" for x in mine])
    assert [listener.port for listener in mine] == [run.report["port"]]
    assert unexpected(mine, gate_port=run.report["port"], in_session=in_session) == []
    # And: the neighbour finds nothing on its port, and cannot join its network.
    tried = knock(apps, port, program)
    assert tried == {
        "127.0.0.1": "ConnectionRefusedError",
        "::1": "ConnectionRefusedError",
        "namespace": "PermissionError",
    }, tried

    # Control: the same program started plainly by alice on that port is open to the neighbour,
    # and the audit names it.
    folder = tempfile.mkdtemp(prefix="app-control-")
    os.chown(folder, apps.owner_uid, -1)
    plain = subprocess.Popen(
        ["runuser", "-u", apps.owner, "--", NODE_PYTHON, "-c", SERVER_CODE, str(port)],
        env={**os.environ, "APP_WORKDIR": folder},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not listens_in(os.getpid(), port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert knock(apps, port, program)["127.0.0.1"] == "connected"
        named = [found for found in tcp_listeners(apps.owner_uid) if found.port == port]
        assert [listener.address for listener in named] == ["127.0.0.1"], report(named)
    finally:
        os.killpg(plain.pid, signal.SIGTERM)
        plain.wait(timeout=30)
        shutil.rmtree(folder)


def test_a_tcp_app_runs_as_its_owner_and_what_it_writes_is_hers(apps: AppRunner) -> None:
    run = apps.launch(web_app())
    assert run.report.get("ready"), run.report
    _, body = run.request("/")
    told = json.loads(body)
    owner = pwd.getpwnam(apps.owner)
    # Inside its namespace it is alice, not root: her uid and gid mapped to themselves.
    assert (told["uid"], told["gid"], told["user"]) == (owner.pw_uid, owner.pw_gid, apps.owner)
    # And the file it wrote in the private folder is hers on the node.
    helper = next(p for p in run.processes() if "--private-network" in args_of(p))
    workdir = Path(args_of(helper)[3]).parent
    made = os.stat(workdir / "made-by-the-app")
    assert (made.st_uid, made.st_gid) == (owner.pw_uid, owner.pw_gid)


def test_a_value_with_shell_metacharacters_reaches_the_program_verbatim_and_runs_nothing(
    apps: AppRunner,
) -> None:
    pwned = f"/tmp/app-pwned-{os.getpid()}-{time.monotonic_ns()}"
    meta = (
        f"; touch {pwned}-1 && $(touch {pwned}-2) `touch {pwned}-3` | tee {pwned}-4 "
        f"> {pwned}-5 \"' \\ * ? ~ {{port}} {{{{secret}}}} $HOME\n\tend"
    )
    run = apps.launch(
        web_app(
            command=[NODE_PYTHON, "-c", SERVER, "{port}", "{meta}", "--also={meta}"],
            env={"APP_WORKDIR": "{workdir}", "APP_VALUE": "{meta}"},
            values={"meta": meta},
        )
    )
    assert run.report.get("ready"), run.report
    _, body = run.request("/")
    told = json.loads(body)
    assert told["argv"] == [meta, f"--also={meta}"]
    assert told["env"] == meta
    assert list(Path("/tmp").glob(Path(pwned).name + "*")) == []

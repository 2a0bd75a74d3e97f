"""A session's program on a compute node: started inside the worker's job, as its owner.

Standard-library Python 3.6+, sent by the platform on stdin after the password's line:
    python3 -c BOOTSTRAP desktop|vscode [--code-server PATH] [--novnc DIR]
(the password is never in argv, which other users may read). It picks a free port,
starts the program there (desktop: Xvnc on the loopback, a terminal in it, websockify serving
noVNC on the port; vscode: code-server with its password), and once the port answers prints one
line of JSON: {"ready": true, "host", "port", "pid"}; on failure {"error": "..."}. It stays in
the foreground, and when any of its programs ends, or it gets SIGTERM or SIGHUP, it ends them all.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, List, NoReturn, Optional, Tuple

READY_WITHIN = 120
children = []  # type: List[subprocess.Popen]
# The programs the session is: when one of them ends, the session's program has ended. (A
# terminal or window manager closed in the desktop is not: the desktop stays.)
essential = []  # type: List[subprocess.Popen]


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def fail(message: str) -> NoReturn:
    say(error=message)
    stop_all()
    sys.exit(1)


def stop_all(*_args: Any) -> None:
    for child in children:
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + 5
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass


def stop_and_exit(*_args: Any) -> None:
    stop_all()
    sys.exit(0)


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(port: int, what: str) -> None:
    deadline = time.time() + READY_WITHIN
    while time.time() < deadline:
        for child in essential:
            if child.poll() is not None:
                fail("%s exited with status %s before it answered" % (what, child.returncode))
        if answers(port):
            return
        time.sleep(0.2)
    fail("%s did not answer on port %d within %d s" % (what, port, READY_WITHIN))


def start(argv: List[str], vital: bool = True, **kwargs: Any) -> subprocess.Popen:
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True, **kwargs
        )
    except OSError as exc:
        fail("cannot start %s: %s" % (argv[0], exc))
    children.append(child)
    if vital:
        essential.append(child)
    return child


def find(*names: str) -> Optional[str]:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def start_x_server(xvnc: str, password_file: str, log: IO[bytes]) -> Tuple[int, int]:
    """Xvnc on the first free display; one taken meanwhile (another user's, or one still
    going away) makes it exit at once, and the next is tried."""
    display = 19
    for _ in range(20):
        display = next(
            n
            for n in range(display + 1, 1000)
            if not os.path.exists("/tmp/.X11-unix/X%d" % n)
            and not os.path.exists("/tmp/.X%d-lock" % n)
        )
        vnc_port = free_port("127.0.0.1")
        server = start(
            [
                xvnc,
                ":%d" % display,
                "-rfbport",
                str(vnc_port),
                "-interface",
                "127.0.0.1",
                "-SecurityTypes",
                "VncAuth",
                "-rfbauth",
                password_file,
                "-geometry",
                "1280x800",
                "-depth",
                "24",
                "-AlwaysShared",
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.time() + READY_WITHIN
        while server.poll() is None and not answers(vnc_port) and time.time() < deadline:
            time.sleep(0.1)
        if server.poll() is None and answers(vnc_port):
            return display, vnc_port
        children.remove(server)
        essential.remove(server)
        if server.poll() is None:
            server.kill()
    fail("Xvnc did not start on any display (see its log)")


def desktop(secret: str, workdir: str, port: int, novnc: str, log: IO[bytes]) -> None:
    xvnc = find("Xtigervnc", "Xvnc")
    vncpasswd = find("tigervncpasswd", "vncpasswd")
    websockify = find("websockify")
    if not (xvnc and vncpasswd and websockify):
        fail("TigerVNC and websockify must be installed on the node")
    if not os.path.isfile(os.path.join(novnc, "vnc.html")):
        fail("noVNC is not installed on the node (no %s/vnc.html)" % novnc)
    password_file = os.path.join(workdir, "vncpasswd")
    with open(password_file, "wb") as out:
        out.write(
            subprocess.run(
                [vncpasswd, "-f"], input=secret.encode(), stdout=subprocess.PIPE, check=True
            ).stdout
        )
    display, vnc_port = start_x_server(xvnc, password_file, log)
    env = dict(os.environ, DISPLAY=":%d" % display)
    window_manager = find("xfwm4", "openbox", "fluxbox", "icewm", "twm")
    if window_manager:
        start([window_manager], vital=False, env=env, stdout=log, stderr=log)
    terminal = find("xterm", "x-terminal-emulator")
    if terminal:
        start(
            [terminal, "-geometry", "120x40+20+20"],
            vital=False,
            env=env,
            cwd=os.path.expanduser("~"),
            stdout=log,
            stderr=log,
        )
    start(
        [websockify, "--web", novnc, "0.0.0.0:%d" % port, "127.0.0.1:%d" % vnc_port],
        stdout=log,
        stderr=log,
    )
    wait_for(port, "websockify")


def vscode(secret: str, workdir: str, port: int, code_server: str, log: IO[bytes]) -> None:
    program = find(code_server) or (code_server if os.access(code_server, os.X_OK) else None)
    if not program:
        fail("code-server is not installed on the node (%s)" % code_server)
    data = os.path.join(os.path.expanduser("~"), ".activate", "code-server")
    # Given as a (legacy, SHA-256) hash, code-server checks its login cookie with a string
    # compare; given in plain text, it runs argon2 on every request (about 50 ms each).
    env = dict(os.environ, HASHED_PASSWORD=hashlib.sha256(secret.encode()).hexdigest())
    env.pop("PASSWORD", None)
    start(
        [
            program,
            "--bind-addr",
            "0.0.0.0:%d" % port,
            "--auth",
            "password",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            "--user-data-dir",
            os.path.join(data, "data"),
            "--extensions-dir",
            os.path.join(data, "extensions"),
            os.path.expanduser("~"),
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    wait_for(port, "code-server")


def main() -> None:
    args = sys.argv[1:]
    kind = args[0] if args else ""
    options = dict(zip(args[1::2], args[2::2]))
    # Run by the platform's bootstrap, which read the password's line before this source.
    secret = str(globals().get("SECRET") or "") or sys.stdin.readline().strip()
    if not secret:
        fail("no password came on stdin")
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, stop_and_exit)
    workdir = tempfile.mkdtemp(prefix="activate-session-")
    log = open(os.path.join(workdir, "log"), "ab")
    port = free_port("0.0.0.0")
    if kind == "desktop":
        desktop(secret, workdir, port, options.get("--novnc", "/usr/share/novnc"), log)
    elif kind == "vscode":
        vscode(secret, workdir, port, options.get("--code-server", "code-server"), log)
    else:
        fail("unknown session type %r" % kind)
    say(ready=True, host=socket.gethostname(), port=port, pid=os.getpid())
    try:
        while all(child.poll() is None for child in essential):
            time.sleep(1)
    finally:
        stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

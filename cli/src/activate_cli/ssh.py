"""pw ssh: a shell or a command on a worker's node, streamed through the platform's WebSocket.

With no command (or with -t) the remote side gets a pseudo-terminal and the local terminal goes
raw, as with ssh: Ctrl-C, vim and job control act on the node. A command without a terminal
streams its stdout and stderr apart, as they come. Either way pw exits with the remote status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from activate_cli.client import USER_AGENT, ApiClient
from activate_cli.errors import CliError, NotFound, Unreachable, UsageError
from activate_cli.workers import not_found, worker_path

STDOUT, STDERR = 1, 2
OPEN_TIMEOUT = 30.0
# Application close codes the platform uses, and what they mean here.
NOT_FOUND = 4404
# ssh's own status when the connection, not the command, failed.
CONNECTION_FAILED = 255


def terminal_url(host: str, worker_id: str) -> str:
    parts = urlsplit(host)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/") + f"/ws/workers/{quote(worker_id, safe='')}/terminal/"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def terminal_size() -> tuple[int, int]:
    size = shutil.get_terminal_size()
    return size.columns, size.lines


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        # TCSANOW, not setraw's default TCSAFLUSH: what was typed ahead must not be thrown away.
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class Session:
    """One terminal: local input to the socket on a thread, the socket's output to stdout."""

    def __init__(self, socket: ClientConnection, *, pty: bool) -> None:
        self.socket = socket
        self.pty = pty

    def send_input(self) -> None:
        fd = sys.stdin.fileno()
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    if not self.pty:
                        self.socket.send(json.dumps({"type": "eof"}))
                    return
                self.socket.send(data)
        except (ConnectionClosed, OSError):
            return

    def resize(self, *_: object) -> None:
        cols, rows = terminal_size()
        with contextlib.suppress(ConnectionClosed):
            self.socket.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def receive_output(self) -> int:
        out, err = sys.stdout.buffer, sys.stderr.buffer
        try:
            for message in self.socket:
                if isinstance(message, bytes):
                    target = err if message[:1] == bytes([STDERR]) else out
                    target.write(message[1:])
                    target.flush()
                    continue
                event = json.loads(message)
                if event.get("type") == "exit":
                    return int(event.get("status", CONNECTION_FAILED))
                if event.get("type") == "error":
                    raise failure(int(event.get("code", 0)), str(event.get("message", "")))
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else 1006
            reason = exc.rcvd.reason if exc.rcvd else ""
            raise failure(code, reason or "the connection to the platform was lost") from None
        raise failure(1006, "the connection to the platform was lost")


def failure(code: int, message: str) -> CliError:
    if code == NOT_FOUND:
        return NotFound(message)
    return CliError(message)


def open_socket(client: ApiClient, worker_id: str) -> ClientConnection:
    url = terminal_url(client.host, worker_id)
    try:
        return connect(
            url,
            additional_headers={"Authorization": f"Bearer {client.api_key}"},
            user_agent_header=USER_AGENT,
            open_timeout=OPEN_TIMEOUT,
            max_size=None,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        raise CliError(f"the platform refused the terminal: HTTP {status}") from None
    except (OSError, TimeoutError, InvalidURI) as exc:
        raise Unreachable(f"cannot open a terminal at {url}: {exc}") from None


def start(
    socket: ClientConnection, argv: list[str], *, pty: bool, keep: str = "", cwd: str = ""
) -> None:
    cols, rows = terminal_size()
    request = {"type": "start", "command": argv, "pty": pty, "cols": cols, "rows": rows}
    if keep:
        request["keep"] = keep
    if cwd:
        request["cwd"] = cwd
    socket.send(json.dumps(dict(request, client="pw")))
    try:
        answer = socket.recv(timeout=OPEN_TIMEOUT)
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else 1006
        raise failure(code, (exc.rcvd.reason if exc.rcvd else "") or "closed") from None
    event: dict[str, Any] = json.loads(answer) if isinstance(answer, str) else {}
    if event.get("type") == "error":
        raise failure(int(event.get("code", 0)), str(event.get("message", "")))
    if event.get("type") != "started":
        raise CliError(f"unexpected answer from the platform: {answer!r:.80}")


def ssh(client: ApiClient, args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    interactive = sys.stdin.isatty()
    pty = args.tty if args.tty is not None else (not argv and interactive)
    if pty and not interactive:
        print("pw: stdin is not a terminal; running without one", file=sys.stderr)
        pty = False
    if args.keep and (argv or not pty):
        raise UsageError("--keep is for a shell in a terminal: no command, and not -T")
    worker = client.get(worker_path(args.worker), not_found=not_found(args.worker))
    with open_socket(client, worker["id"]) as socket:
        start(socket, argv, pty=pty, keep=args.keep, cwd=args.cwd)
        session = Session(socket, pty=pty)
        if not pty:
            threading.Thread(target=session.send_input, daemon=True).start()
            return session.receive_output()
        signal.signal(signal.SIGWINCH, session.resize)
        # Raw before the first read: keys then go as typed (Ctrl-C, arrows), none lost.
        with raw_terminal(sys.stdin.fileno()):
            threading.Thread(target=session.send_input, daemon=True).start()
            return session.receive_output()


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "ssh",
        help="open a shell (or run a command) on a worker's node",
        description="With no command: a login shell on the worker's node, in a terminal. "
        "With a command (after --): its output as it comes, and its exit status.",
        parents=[common],
    )
    p.add_argument("worker", metavar="WORKER")
    tty_group = p.add_mutually_exclusive_group()
    tty_group.add_argument(
        "-t", dest="tty", action="store_const", const=True, help="force a terminal"
    )
    tty_group.add_argument("-T", dest="tty", action="store_const", const=False, help="no terminal")
    p.add_argument(
        "--keep",
        default="",
        metavar="NAME",
        help="before WORKER: a shell kept on the node (tmux) that outlives this connection; "
        "--keep NAME again reattaches it (the browser's terminal is 'main')",
    )
    p.add_argument(
        "--cwd",
        default="",
        metavar="FOLDER",
        help="before WORKER: the folder on the node to start in (absolute, or ~/...; "
        "default: your home)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    p.set_defaults(run=ssh, tty=None)

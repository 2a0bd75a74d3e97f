"""A relay on a login host and the SSH remote forward behind it: plain values, no Django.

Over its own SSH connection the platform asks the login host's sshd to listen on the login
host's loopback (``tcpip-forward``, port chosen by the server, so no sshd setting such as
GatewayPorts is needed) and to send each connection made there back over that connection; each
is joined here to the platform's agents' server (``upstream``). Then it starts the relay
(``node/activate_relay.py``) on an exec channel: the relay listens where compute
nodes reach it and passes agent requests, and nothing else, to the forwarded port. The relay
reads its stdin until the channel closes, so it ends with the SSH session that started it.

Any local user of the login host can connect to the forwarded port, so a connection arriving
here is joined to the agents' server only when it begins with this tunnel's proof: random, new
for every tunnel, sent to the relay on its stdin. Anyone else's connection is dropped before a
byte of it leaves this process. (OpenSSH's forward to a Unix socket would keep others out by
file mode, but paramiko's client refuses the channels it opens.)
"""

from __future__ import annotations

import hmac
import logging
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import paramiko

from core.transport.connection import SSHConnection
from core.transport.errors import SSHError

log = logging.getLogger(__name__)
T = TypeVar("T")

# The relay's source comes on stdin after its length; the rest of stdin is its lifeline.
BOOT = (
    "import sys;n=int(sys.stdin.buffer.readline());"
    "exec(compile(sys.stdin.buffer.read(n),'activate-relay','exec'))"
)
# A relayed connection with no byte either way for this long is dropped.
IDLE_TIMEOUT = 60.0
STDERR_KEPT = 2000
# Seconds a forwarded connection has to present the proof before it is dropped.
PROOF_TIMEOUT = 5.0


class TunnelError(SSHError):
    """The forward or the relay could not be set up, or stopped working."""


@dataclass(frozen=True)
class RelayEndpoint:
    port: int  # where the relay listens on the login host
    hostname: str  # the login host's own name, as it reports it
    forwarded_port: int  # the login host's loopback port sshd forwards to the platform


class RelayTunnel:
    """One relay and its forward, over one SSH connection that nothing else uses."""

    def __init__(
        self,
        connection: SSHConnection,
        *,
        upstream: tuple[str, int],
        upstream_host: str,
        source: str,
        tag: str,
        bind_host: str,
        bind_port: int,
        timeout: float,
    ) -> None:
        self.connection = connection
        self.upstream = upstream
        self.upstream_host = upstream_host
        self.source = source
        self.tag = tag
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.timeout = timeout
        self.endpoint: RelayEndpoint | None = None
        self.relayed = 0
        self.refused = 0
        self.proof = b""
        self._transport: paramiko.Transport | None = None
        self._channel: paramiko.Channel | None = None
        self._stderr = b""

    def __repr__(self) -> str:
        return f"<RelayTunnel {self.tag} via {self.connection!r}>"

    # -- setting up -------------------------------------------------------------------------

    def open(self) -> RelayEndpoint:
        """Connect, forward, start the relay; returns where it listens. TunnelError (or any
        SSHError) when one step fails; whatever was set up is closed again."""
        try:
            return self._open()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TunnelError(f"cannot set up the relay: {exc or type(exc).__name__}") from exc
        except SSHError:
            self.close()
            raise

    def _open(self) -> RelayEndpoint:
        transport = self.connection.transport()
        self._transport = transport
        self.proof = secrets.token_hex(32).encode()
        forwarded = self._in_time(
            lambda: transport.request_port_forward("127.0.0.1", 0, handler=self._incoming),
            "the port forward request",
        )
        channel = transport.open_session(timeout=self.timeout)
        self._channel = channel
        argv = ["python3", "-c", BOOT, "activate-relay", self.tag, self.bind_host]
        argv += [str(self.bind_port), str(forwarded), self.upstream_host]
        channel.exec_command(shlex.join(argv))
        source = self.source.encode()
        channel.sendall(f"{len(source)}\n".encode() + source + self.proof + b"\n")
        line = self._first_line(channel, time.monotonic() + self.timeout)
        words = line.split()
        if len(words) != 3 or words[0] != "READY" or not words[1].isdigit():
            raise TunnelError(f"the relay said {line[:200]!r} instead of READY")
        self.endpoint = RelayEndpoint(
            port=int(words[1]), hostname=words[2], forwarded_port=int(forwarded)
        )
        log.info("relay %s up on port %s of %s", self.tag, words[1], words[2])
        return self.endpoint

    def _first_line(self, channel: paramiko.Channel, deadline: float) -> str:
        data = b""
        while b"\n" not in data:
            self._drain_stderr()
            if time.monotonic() > deadline:
                raise TunnelError("the relay did not start in time")
            if channel.recv_ready():
                chunk = channel.recv(4096)
                if not chunk:
                    break
                data += chunk
            elif channel.exit_status_ready():
                break
            else:
                time.sleep(0.02)
        if b"\n" not in data:
            self._drain_stderr()
            raise TunnelError(f"the relay did not start: {self.stderr_text() or 'no output'}")
        return data.split(b"\n", 1)[0].decode(errors="replace")

    def _in_time(self, call: Callable[[], T], what: str) -> T:
        """paramiko waits forever for an answer to a global request; this waits ``timeout``."""
        result: list[T] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                result.append(call())
            except BaseException as exc:  # handed to the calling thread
                failure.append(exc)

        thread = threading.Thread(target=run, name=f"relay-{self.tag}-request", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if failure:
            raise failure[0]
        if not result:
            raise TunnelError(f"{what} got no answer in {self.timeout:g}s")
        return result[0]

    # -- relayed connections ----------------------------------------------------------------

    def _incoming(
        self, channel: paramiko.Channel, origin: tuple[str, int], server: tuple[str, int]
    ) -> None:
        # Called on paramiko's transport thread: nothing here may block it.
        threading.Thread(
            target=self._join, args=(channel,), name=f"relay-{self.tag}-conn", daemon=True
        ).start()

    def _join(self, channel: paramiko.Channel) -> None:
        if not self._proven(channel):
            self.refused += 1
            log.warning("relay %s: a forwarded connection without the proof, dropped", self.tag)
            channel.close()
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=self.timeout)
        except OSError as exc:
            log.warning("relay %s: the agents' server %s:%s: %s", self.tag, *self.upstream, exc)
            channel.close()
            return
        self.relayed += 1
        try:
            _pump(channel, upstream)
        finally:
            upstream.close()
            channel.close()

    def _proven(self, channel: paramiko.Channel) -> bool:
        """Whether the connection begins with this tunnel's proof (and its newline)."""
        expected = self.proof + b"\n"
        received = b""
        deadline = time.monotonic() + PROOF_TIMEOUT
        try:
            while len(received) < len(expected):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                channel.settimeout(left)
                chunk = channel.recv(len(expected) - len(received))
                if not chunk:
                    return False
                received += chunk
        except (OSError, EOFError, paramiko.SSHException):
            return False
        return bool(self.proof) and hmac.compare_digest(received, expected)

    # -- watching ---------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why agents cannot get through now, or None when the connection and relay live."""
        transport, channel = self._transport, self._channel
        if transport is None or channel is None:
            return "not set up"
        if not transport.is_active():
            return "the SSH connection dropped"
        self._drain_stderr()
        if channel.exit_status_ready() or channel.closed:
            status = channel.exit_status if channel.exit_status_ready() else -1
            said = self.stderr_text()
            return f"the relay process ended (exit status {status})" + (f": {said}" if said else "")
        try:
            self._in_time(
                lambda: transport.global_request("keepalive@openssh.com", wait=True),
                "a keepalive",
            )
        except (TunnelError, OSError, EOFError, paramiko.SSHException) as exc:
            return f"the SSH connection does not answer: {exc}"
        if not transport.is_active():
            return "the SSH connection dropped"
        return None

    def visibly_broken(self) -> bool:
        """What shows without asking the server: the relay ended or the connection dropped."""
        transport, channel = self._transport, self._channel
        if transport is None or channel is None:
            return False
        return not transport.is_active() or channel.exit_status_ready() or channel.closed

    def _drain_stderr(self) -> None:
        channel = self._channel
        while channel is not None and channel.recv_stderr_ready():
            self._stderr = (self._stderr + channel.recv_stderr(4096))[-STDERR_KEPT:]

    def stderr_text(self) -> str:
        return " ".join(self._stderr.decode(errors="replace").split())[-500:]

    def close(self) -> None:
        """Ends the relay too: its stdin closes with the connection."""
        if self._channel is not None:
            self._channel.close()
        self.connection.close()
        self._transport = None


def _pump(channel: paramiko.Channel, upstream: socket.socket) -> None:
    """Bytes both ways until either side ends (the relay sends one request per connection)."""
    channel.settimeout(IDLE_TIMEOUT)
    upstream.settimeout(IDLE_TIMEOUT)
    try:
        while True:
            ready, _, _ = select.select([channel.fileno(), upstream.fileno()], [], [], IDLE_TIMEOUT)
            if not ready:
                return
            if upstream.fileno() in ready:
                data = upstream.recv(65536)
                if not data:
                    return
                channel.sendall(data)
            if channel.fileno() in ready:
                data = channel.recv(65536)
                if not data:
                    return
                upstream.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        return

"""The SSH transport: commands on a login host over one kept paramiko connection.

Opening an SSH session costs ~0.5 s; a channel on an open one costs milliseconds. So a
connection keeps its transport and every thread shares it (channels are capped by a semaphore
so the server's MaxSessions is not hit). The server's host key must equal the pinned one;
there is no known_hosts, no agent and no key search. This module takes plain values and knows
nothing of Django: ``workers_app.connections`` decides which connection serves whom.
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import paramiko

from workers_app.transport.hostkeys import parse_key_line

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL = 15
READ_CHUNK = 65536
# How often a blocked stdout read wakes up to drain stderr (so neither stream stalls the other).
POLL_INTERVAL = 0.2


@dataclass(frozen=True)
class CommandResult:
    exit_status: int  # -1 when the output was cut short before the command ended
    stdout: str
    stderr: str
    # The output passed the caller's limit: what came so far, and the command was left.
    truncated: bool = False


class SSHError(Exception):
    """The cluster could not be reached or the connection broke: nothing is known."""


class HostKeyMismatch(SSHError):
    """The server did not present the pinned host key. Never connect anyway."""


class AuthenticationFailed(SSHError):
    """The server is there and refused this login (wrong user or key)."""


class CommandTimeout(SSHError):
    """A command did not finish in time; whether it had an effect is unknown."""


def _pinned_key(host_key_line: str) -> paramiko.PKey:
    if not host_key_line.strip():
        raise SSHError("no host key is pinned for this cluster; refusing to connect")
    try:
        key_type, blob = parse_key_line(host_key_line)
        return paramiko.PKey.from_type_string(key_type, blob)
    except (ValueError, paramiko.SSHException) as exc:
        raise SSHError(f"the pinned host key is unusable: {exc}") from None


def _private_key(text: str) -> paramiko.PKey:
    if not text.strip():
        raise SSHError("no private key is stored for this cluster")
    key_classes: list[type[paramiko.PKey]] = [
        paramiko.Ed25519Key,
        paramiko.ECDSAKey,
        paramiko.RSAKey,
    ]
    for key_class in key_classes:
        try:
            return key_class.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError):
            continue
    raise SSHError("the stored private key is not a usable ed25519, ECDSA or RSA key")


class _PinnedKeyPolicy(paramiko.RejectPolicy):
    """Refuse any host without a pinned key (the pinned one is registered under the name
    paramiko looks up, so a different key raises BadHostKeyException instead)."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> NoReturn:
        raise HostKeyMismatch(
            f"{hostname} presented a {key.get_name()} key ({key.fingerprint}), not the pinned one"
        )


_total_lock = threading.Lock()
_total_commands = 0


def commands_run_total() -> int:
    """Commands run over SSH by this process, all clusters together (for benchmarks)."""
    return _total_commands


def _count_command() -> None:
    global _total_commands
    with _total_lock:
        _total_commands += 1


def _why(exc: BaseException) -> str:
    """A connection failure in words: paramiko's "[Errno None] Unable to connect..." is not."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {
            "refused"
            if isinstance(e, ConnectionRefusedError)
            else (getattr(e, "strerror", None) or str(e)).lower()
            for e in exc.errors.values()
        }
        return "; ".join(sorted(reasons))
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


class SSHConnection:
    """A CommandRunner over one kept SSH transport. Safe to share between threads."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        username: str,
        private_key: str,
        host_key: str,
        connect_timeout: float,
        command_timeout: float,
        max_channels: int,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self._private_key = private_key
        self._host_key = host_key
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.max_channels = max_channels
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_channels)
        self._count_lock = threading.Lock()
        self.commands_run = 0
        self.connects = 0
        self.in_use = 0
        self.streams = 0
        self.last_used = time.monotonic()

    def __repr__(self) -> str:
        return f"<SSHConnection {self.username}@{self.host}:{self.port}>"

    # -- connection -------------------------------------------------------------------------

    def _connect(self) -> paramiko.SSHClient:
        pinned = _pinned_key(self._host_key)
        pkey = _private_key(self._private_key)
        client = paramiko.SSHClient()
        # Only the pinned key is known; nothing is read from or written to known_hosts files.
        known_as = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        client.get_host_keys().add(known_as, pinned.get_name(), pinned)
        client.set_missing_host_key_policy(_PinnedKeyPolicy())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.username,
                pkey=pkey,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                look_for_keys=False,
                allow_agent=False,
            )
        except HostKeyMismatch:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyMismatch(
                f"{self.host}:{self.port} presented host key {exc.key.fingerprint}, "
                f"but {exc.expected_key.fingerprint} is pinned"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthenticationFailed(f"authentication as {self.username} failed: {exc}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise SSHError(f"cannot connect to {self.host}:{self.port}: {_why(exc)}") from exc
        transport = client.get_transport()
        if transport is None:  # pragma: no cover - connect() always sets one
            raise SSHError(f"cannot connect to {self.host}:{self.port}: no transport")
        transport.set_keepalive(KEEPALIVE_INTERVAL)
        self.connects += 1
        log.info("connected to %s@%s:%s", self.username, self.host, self.port)
        return client

    def _transport(self, *, stale: paramiko.Transport | None = None) -> paramiko.Transport:
        with self._lock:
            current = self._client.get_transport() if self._client else None
            if current is not None and current.is_active() and current is not stale:
                return current
            if self._client is not None:
                self._client.close()
                self._client = None
            self._client = self._connect()
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def _open_channel(self) -> paramiko.Channel:
        transport = self._transport()
        try:
            return transport.open_session(timeout=self.connect_timeout)
        except paramiko.ChannelException as exc:
            # The server is there and refused this channel (e.g. MaxSessions); other threads'
            # commands on this connection are fine, so it must not be torn down.
            raise SSHError(f"{self.host} refused a channel: {exc}") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            # The kept connection went away (server restart, network). Nothing ran yet, so one
            # fresh connection is safe to try.
            log.info("reconnecting to %s:%s after: %s", self.host, self.port, exc)
        transport = self._transport(stale=transport)
        try:
            return transport.open_session(timeout=self.connect_timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"cannot open a channel to {self.host}:{self.port}: {exc}") from exc

    def transport(self) -> paramiko.Transport:
        """The live transport, connected first if needed: for forwards and long-lived channels
        (workers_app.transport.tunnel), which commands' channel slots do not cover."""
        return self._transport()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    @property
    def is_connected(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return transport is not None and transport.is_active()

    # -- interactive streams ----------------------------------------------------------------

    def open_stream(
        self, command: str, *, pty: PtySize | None, on_close: Callable[[], None] | None = None
    ) -> Stream:
        """Start ``command`` (a line for the remote shell) on a channel of its own, kept open.

        Streams do not take the command slots: a terminal left open must never hold back the
        platform's own commands on this connection.
        """
        channel = self._open_channel()
        try:
            if pty is not None:
                channel.get_pty(term=pty.term, width=pty.cols, height=pty.rows)
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            channel.close()
            raise SSHError(f"cannot start {command[:80]!r} on {self.host}: {exc}") from exc
        with self._count_lock:
            self.commands_run += 1
            self.in_use += 1
            self.streams += 1
        _count_command()

        def closed() -> None:
            with self._count_lock:
                self.in_use -= 1
                self.streams -= 1
                self.last_used = time.monotonic()
            if on_close is not None:
                on_close()

        return Stream(channel, merged=pty is not None, on_close=closed)

    # -- tunnels to compute nodes -----------------------------------------------------------

    def open_tunnel(self, host: str, port: int) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from the server to host:port (a service on a compute node).

        Counted as in use until ``tunnel_closed``, so the connection is not closed as idle under
        it; like streams, tunnels do not take the command slots.
        """
        transport = self._transport()
        for attempt in range(2):
            try:
                channel = transport.open_channel(
                    "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=self.connect_timeout
                )
                break
            except paramiko.ChannelException as exc:
                raise SSHError(f"{self.host} could not reach {host}:{port}: {exc}") from exc
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if attempt:
                    raise SSHError(f"cannot open a tunnel through {self.host}: {exc}") from exc
                transport = self._transport(stale=transport)
        with self._count_lock:
            self.in_use += 1
        return channel

    def tunnel_closed(self) -> None:
        with self._count_lock:
            self.in_use -= 1
            self.last_used = time.monotonic()

    # -- commands ---------------------------------------------------------------------------

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        """Run argv (each word quoted for the remote shell); stdin, if given, is sent and closed.

        Raises SSHError when the cluster cannot be reached, CommandTimeout when the command
        outlives ``timeout``; a non-zero exit is a normal result, not an exception. Past
        ``output_limit`` bytes of output the command is left (its channel closed) and the
        result says ``truncated``.
        """
        if not argv:
            raise ValueError("empty command")
        command = shlex.join(argv)
        limit = self.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._count_lock:
            self.in_use += 1
        try:
            if not self._slots.acquire(timeout=limit):
                raise CommandTimeout(f"all {self.max_channels} channels to {self.host} stayed busy")
            try:
                channel = self._open_channel()
                try:
                    return self._execute(channel, command, stdin, deadline, output_limit)
                finally:
                    channel.close()
            finally:
                self._slots.release()
        finally:
            with self._count_lock:
                self.in_use -= 1
                self.last_used = time.monotonic()

    def _execute(
        self,
        channel: paramiko.Channel,
        command: str,
        stdin: str | None,
        deadline: float,
        output_limit: int | None,
    ) -> CommandResult:
        try:
            channel.settimeout(max(0.001, deadline - time.monotonic()))
            channel.exec_command(command)
            with self._count_lock:
                self.commands_run += 1
            _count_command()
            if stdin:
                self._send_stdin(channel, stdin)
            channel.shutdown_write()
            stdout, stderr = self._read_all(channel, deadline, output_limit)
        except TimeoutError:
            raise CommandTimeout(f"{command[:80]!r} did not finish in time") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"connection to {self.host} broke during a command: {exc}") from exc
        if output_limit is not None and len(stdout) + len(stderr) > output_limit:
            return CommandResult(
                exit_status=-1,
                stdout=stdout[:output_limit].decode(errors="replace"),
                stderr=stderr[: max(0, output_limit - len(stdout))].decode(errors="replace"),
                truncated=True,
            )
        transport = channel.get_transport()
        if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise CommandTimeout(f"{command[:80]!r} sent no exit status in time")
        status = channel.exit_status
        if status == -1 and not transport.is_active():
            raise SSHError(f"connection to {self.host} broke before {command[:80]!r} finished")
        return CommandResult(
            exit_status=status,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
        )

    @staticmethod
    def _send_stdin(channel: paramiko.Channel, stdin: str) -> None:
        try:
            channel.sendall(stdin.encode())
        except TimeoutError:
            raise
        except OSError:
            # The command closed its end without reading everything (e.g. it failed early);
            # its exit status and stderr say why, so read them instead of failing here.
            transport = channel.get_transport()
            if not transport.is_active():
                raise

    @staticmethod
    def _read_all(
        channel: paramiko.Channel, deadline: float, output_limit: int | None = None
    ) -> tuple[bytes, bytes]:
        # Both streams share one flow-control window: reading only stdout while the command
        # fills stderr would stall it forever, so stderr is drained on every wake-up.
        stdout = bytearray()
        stderr = bytearray()
        limit = float("inf") if output_limit is None else output_limit
        while True:
            if len(stdout) + len(stderr) > limit:
                return bytes(stdout), bytes(stderr)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            channel.settimeout(min(remaining, POLL_INTERVAL))
            try:
                data = channel.recv(READ_CHUNK)
            except TimeoutError:
                data = None
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(READ_CHUNK)
            if data is None:
                continue
            if not data:
                break
            stdout += data
        while len(stdout) + len(stderr) <= limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            channel.settimeout(remaining)
            data = channel.recv_stderr(READ_CHUNK)
            if not data:
                break
            stderr += data
        return bytes(stdout), bytes(stderr)


@dataclass(frozen=True)
class PtySize:
    cols: int
    rows: int
    term: str = "xterm-256color"


STDOUT = 1
STDERR = 2
# Input waiting to be sent past this is refused: a paste into a program that stopped reading.
MAX_PENDING_INPUT = 4 * 1024 * 1024


class Stream:
    """One interactive command: input in, output out as it comes, then its exit status.

    A reader thread hands each chunk to ``on_output(stream_id, data)`` (which may block: that
    is the back-pressure into the SSH window) and then calls ``on_end(exit_status)``. Input is
    queued and sent by a writer thread, so a caller on an event loop never blocks.
    """

    def __init__(self, channel: paramiko.Channel, *, merged: bool, on_close: Callable[[], None]):
        self._channel = channel
        self._merged = merged
        self._on_close = on_close
        self._closed = False
        self._close_lock = threading.Lock()
        self._input: list[bytes | None] = []
        self._input_bytes = 0
        self._input_ready = threading.Condition()

    def start(
        self, on_output: Callable[[int, bytes], None], on_end: Callable[[int | None], None]
    ) -> None:
        threading.Thread(
            target=self._read, args=(on_output, on_end), name="stream-reader", daemon=True
        ).start()
        threading.Thread(target=self._write, name="stream-writer", daemon=True).start()

    def write(self, data: bytes) -> None:
        with self._input_ready:
            if self._input_bytes + len(data) > MAX_PENDING_INPUT:
                raise SSHError("the command is not reading its input")
            self._input.append(data)
            self._input_bytes += len(data)
            self._input_ready.notify()

    def end_input(self) -> None:
        with self._input_ready:
            self._input.append(None)
            self._input_ready.notify()

    def resize(self, cols: int, rows: int) -> None:
        try:
            self._channel.resize_pty(width=cols, height=rows)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command is ending; its exit tells the client

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._input_ready:
            self._input.append(None)
            self._input_ready.notify()
        self._channel.close()
        self._on_close()

    def _write(self) -> None:
        while True:
            with self._input_ready:
                while not self._input:
                    self._input_ready.wait()
                data = self._input.pop(0)
                if data is not None:
                    self._input_bytes -= len(data)
            try:
                if data is None:
                    if not self._closed:
                        self._channel.shutdown_write()
                    return
                self._channel.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                return

    def _read(
        self, on_output: Callable[[int, bytes], None], on_end: Callable[[int | None], None]
    ) -> None:
        # Blocking reads, a thread per stream: an open terminal costs no wake-ups while idle.
        channel = self._channel
        channel.settimeout(None)
        stderr = None
        if not self._merged:
            stderr = threading.Thread(
                target=self._pump,
                args=(channel.recv_stderr, STDERR, on_output),
                name="stream-stderr",
                daemon=True,
            )
            stderr.start()
        self._pump(channel.recv, STDOUT, on_output)
        if stderr is not None:
            stderr.join()
        # A channel closed from our side never gets a status: don't wait for one forever.
        status = channel.exit_status if channel.status_event.wait(10) else None
        on_end(None if status == -1 else status)

    @staticmethod
    def _pump(
        recv: Callable[[int], bytes], stream_id: int, on_output: Callable[[int, bytes], None]
    ) -> None:
        try:
            while data := recv(READ_CHUNK):
                on_output(stream_id, data)
        except (OSError, EOFError, paramiko.SSHException):
            return


def _forget_counters_after_fork() -> None:
    global _total_lock
    _total_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_counters_after_fork)

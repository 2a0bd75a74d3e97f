"""One kept SSH connection to a login host, and the counters of what went over it.

Opening an SSH session costs ~0.5 s; a channel on an open one costs milliseconds. So a
connection keeps its transport and every thread shares it (commands' channels are capped by a
semaphore so the server's MaxSessions is not hit). The server's host key must equal the pinned
one; there is no known_hosts, no agent and no key search. A login may present a certificate
with its key, both from strings, never a file. What runs on a channel lives beside this module:
``commands``, ``streams``, ``channels`` and ``tunnel``.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import paramiko

from core.transport import commands
from core.transport.channels import Channel
from core.transport.commands import CommandResult
from core.transport.errors import AuthenticationFailed, CommandTimeout, HostKeyMismatch, SSHError
from core.transport.hostkeys import parse_key_line
from core.transport.sftp import SFTPClient, SFTPSession
from core.transport.silence import PeerSilence
from core.transport.streams import PtySize, Stream, start_stream

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL = 15
DEFAULT_SILENCE = PeerSilence(30)
# An SFTP channel's window and largest packet from the server: a transfer's reads in flight
# (core/transport/sftp.py) fit in the window, and fewer, larger packets cost less Python.
SFTP_WINDOW = 16 * 1024 * 1024
SFTP_PACKET = 256 * 1024


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


def _with_certificate(pkey: paramiko.PKey, line: str) -> paramiko.PKey:
    """``pkey`` presenting the OpenSSH certificate ``line`` ("<type>-cert-v01@openssh.com AAAA...
    [comment]") instead of its bare public key; read from the string, never from a file."""
    fields = line.split()
    try:
        blob = base64.b64decode(fields[1], validate=True)
        # A Message, not the line: load_certificate takes a string for a file name first.
        pkey.load_certificate(paramiko.Message(blob))
    except (IndexError, ValueError, paramiko.SSHException) as exc:
        raise SSHError(f"the certificate is unusable: {exc}") from None
    if pkey.public_blob is None or pkey.public_blob.key_type != fields[0]:
        raise SSHError("the certificate's type does not match its line")
    return pkey


@dataclass(frozen=True)
class Credentials:
    """What a login presents: a private key, and the certificate signed for it, if any."""

    private_key: str = field(repr=False)
    certificate: str = ""


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
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    strerror = getattr(exc, "strerror", None)
    return strerror.lower() if strerror else str(exc) or type(exc).__name__


class _QuickAckSocket(socket.socket):
    """The SSH connection's socket: small messages leave at once and are acknowledged at once.

    Channels carry small messages that wait for each other (a channel's opening, a handshake's
    lines, an answer's head and then its body). Nagle on our side held each behind the previous
    one's ACK; and sshd keeps Nagle on for forwards, so a reply in two writes waited for our ACK
    of the first, which Linux delays ~40 ms when we have nothing to send: TCP_QUICKACK, which the
    kernel clears as it goes, is set again after every read.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        return data


QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


# AES-GCM before the rest: one AES-NI pass where CTR adds an HMAC-SHA-256 on each side, paramiko's
# in Python (measured on the test cluster's SFTP, alternating: uploads 206 -> 288 MB/s, downloads
# 209 -> 238). A server without it gets CTR, as before.
GCM = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _gcm_first(sock: Any, /, **options: Any) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **options)
    security = transport.get_security_options()
    offered = tuple(security.ciphers)
    security.ciphers = (*(c for c in GCM if c in offered), *(c for c in offered if c not in GCM))
    return transport


def _tcp(host: str, port: int, timeout: float, silence: PeerSilence) -> socket.socket:
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = _QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            silence.apply(sock)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"cannot resolve {host}")


class SSHConnection:
    """A CommandRunner over one kept SSH transport. Safe to share between threads."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        username: str,
        private_key: str = "",
        certificate: str = "",
        credentials: Callable[[], Credentials] | None = None,
        host_key: str,
        connect_timeout: float,
        command_timeout: float,
        max_channels: int,
        on_channel_wait: Callable[[float], None] | None = None,
        silence: PeerSilence = DEFAULT_SILENCE,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        # Asked at each login when given (a certificate lasts minutes, a connection longer).
        self._credentials = credentials or (lambda: Credentials(private_key, certificate))
        self._host_key = host_key
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.max_channels = max_channels
        # A login host cut off (not closed) ends the connection within it, and with it every
        # channel on it (terminals, tunnels), instead of after TCP's two hours.
        self.silence = silence
        # Told the seconds a command waited for a channel slot, when it had to (metrics).
        self.on_channel_wait = on_channel_wait
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_channels)
        self._count_lock = threading.Lock()
        self.commands_run = 0
        self.connects = 0
        self.in_use = 0
        self.streams = 0
        # Commands holding or waiting for a channel slot.
        self.commands = 0
        self.last_used = time.monotonic()

    def __repr__(self) -> str:
        return f"<SSHConnection {self.username}@{self.host}:{self.port}>"

    # -- connection -------------------------------------------------------------------------

    def _connect(self) -> paramiko.SSHClient:
        pinned = _pinned_key(self._host_key)
        credentials = self._credentials()
        pkey = _private_key(credentials.private_key)
        if credentials.certificate:
            pkey = _with_certificate(pkey, credentials.certificate)
        client = paramiko.SSHClient()
        # Only the pinned key is known; nothing is read from or written to known_hosts files.
        known_as = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        client.get_host_keys().add(known_as, pinned.get_name(), pinned)
        client.set_missing_host_key_policy(_PinnedKeyPolicy())
        try:
            client.connect(
                self.host,
                sock=_tcp(self.host, self.port, self.connect_timeout, self.silence),
                port=self.port,
                username=self.username,
                pkey=pkey,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                look_for_keys=False,
                allow_agent=False,
                transport_factory=_gcm_first,
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

    def _open_channel(self, **sizes: int) -> paramiko.Channel:
        transport = self._transport()
        try:
            return transport.open_session(timeout=self.connect_timeout, **sizes)
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
            return transport.open_session(timeout=self.connect_timeout, **sizes)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"cannot open a channel to {self.host}:{self.port}: {exc}") from exc

    def transport(self) -> paramiko.Transport:
        """The live transport, connected first if needed: for forwards and long-lived channels
        (``tunnel``), which commands' channel slots do not cover."""
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
        start_stream(channel, command, pty=pty, host=self.host)
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

    def open_tunnel(self, host: str, port: int) -> Channel:
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
        # What listens there may speak first (a session's gate greets). sshd sends those bytes
        # right behind its confirmation of the channel, and with Nagle (OpenSSH keeps it on for
        # forwards) holds them until we ACK the confirmation, which our kernel delays ~40 ms
        # when we have nothing to send. An SSH ignore message is something to send.
        with contextlib.suppress(paramiko.SSHException):
            transport.send_ignore(1)
        with self._count_lock:
            self.in_use += 1
        return channel

    def tunnel_closed(self) -> None:
        with self._count_lock:
            self.in_use -= 1
            self.last_used = time.monotonic()

    # -- files ------------------------------------------------------------------------------

    def open_sftp(self, *, timeout: float | None = None) -> SFTPSession:
        """An SFTP session on a channel of its own, holding one of the commands' slots until it
        is closed (a transfer is a long command: connection_for then serves others elsewhere).
        ``timeout`` bounds the wait for a slot and for each answer of the server."""
        limit = self.command_timeout if timeout is None else timeout
        with self._count_lock:
            self.in_use += 1
            self.commands += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._slots.release()
            with self._count_lock:
                self.in_use -= 1
                self.commands -= 1
                self.last_used = time.monotonic()

        if not self._take_slot(limit):
            released = True
            with self._count_lock:
                self.in_use -= 1
                self.commands -= 1
            raise CommandTimeout(f"all {self.max_channels} channels to {self.host} stayed busy")
        try:
            channel = self._open_channel(window_size=SFTP_WINDOW, max_packet_size=SFTP_PACKET)
            try:
                channel.settimeout(limit)
                channel.invoke_subsystem("sftp")
                return SFTPSession(SFTPClient(channel), on_close=release)
            except BaseException:
                channel.close()
                raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            release()
            raise SSHError(f"{self.host} did not start SFTP: {_why(exc)}") from None
        except BaseException:
            release()
            raise

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
            self.commands += 1
        try:
            if not self._take_slot(limit):
                raise CommandTimeout(f"all {self.max_channels} channels to {self.host} stayed busy")
            try:
                channel = self._open_channel()
                try:
                    return commands.execute(
                        channel,
                        command,
                        host=self.host,
                        stdin=stdin,
                        deadline=deadline,
                        output_limit=output_limit,
                        started=self._command_started,
                    )
                finally:
                    channel.close()
            finally:
                self._slots.release()
        finally:
            with self._count_lock:
                self.in_use -= 1
                self.commands -= 1
                self.last_used = time.monotonic()

    def _take_slot(self, timeout: float) -> bool:
        if self._slots.acquire(blocking=False):
            return True
        waiting_since = time.monotonic()
        taken = self._slots.acquire(timeout=timeout)
        if self.on_channel_wait is not None:
            self.on_channel_wait(time.monotonic() - waiting_since)
        return taken

    @property
    def channels_taken(self) -> bool:
        """Every command slot is held or asked for: a command now would wait."""
        return self.commands >= self.max_channels

    def _command_started(self) -> None:
        with self._count_lock:
            self.commands_run += 1
        _count_command()


def _forget_counters_after_fork() -> None:
    global _total_lock
    _total_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_counters_after_fork)

"""``direct-tcpip`` channels: a connection from the login host to a port on a compute node (a
session's program). Seen from asyncio as a stream pair, or used for one HTTP request.

Channels block; an event loop must not. A pipe gives each direction a thread of its own, so a
slow reader on one side never stalls the other direction.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import TypeAlias

import h11
import paramiko

# What SSHConnection.open_tunnel returns, named here so that callers need not import paramiko.
Channel: TypeAlias = paramiko.Channel
CHUNK = 65536
HTTP_TIMEOUT = 20.0


class ChannelPipe:
    """A channel as an asyncio stream pair; ``on_close`` runs once both directions ended or
    ``close`` was called."""

    def __init__(self, channel: Channel, on_close: Callable[[], None]) -> None:
        self._channel = channel
        self._on_close: Callable[[], None] | None = on_close
        self._ours, self._theirs = socket.socketpair()
        self._lock = threading.Lock()
        # Held while closing: a second close (or the last direction's) returns once it is done.
        self._closing = threading.RLock()
        self._open_directions = 2

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._channel.settimeout(None)
        threading.Thread(target=self._from_channel, daemon=True, name="tunnel-in").start()
        threading.Thread(target=self._to_channel, daemon=True, name="tunnel-out").start()
        return await asyncio.open_connection(sock=self._theirs, limit=4 * CHUNK)

    def _from_channel(self) -> None:
        try:
            while data := self._channel.recv(CHUNK):
                self._ours.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        try:
            self._ours.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._direction_done()

    def _to_channel(self) -> None:
        try:
            while data := self._ours.recv(CHUNK):
                self._channel.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        self._channel.close()
        self._direction_done()

    def _direction_done(self) -> None:
        with self._lock:
            self._open_directions -= 1
            last = self._open_directions == 0
        if last:
            self.close()

    def close(self) -> None:
        with self._closing:
            with self._lock:
                if self._on_close is None:
                    return
                on_close, self._on_close = self._on_close, None
            self._channel.close()
            self._ours.close()
            on_close()


def http_request(
    channel: Channel, method: str, target: str, headers: list[tuple[str, str]], body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One HTTP/1.1 request over a channel, read to its end (blocking)."""
    client = h11.Connection(h11.CLIENT)
    sent = client.send(h11.Request(method=method, target=target, headers=headers))
    sent += client.send(h11.Data(data=body)) if body else b""
    sent += client.send(h11.EndOfMessage())
    channel.settimeout(HTTP_TIMEOUT)
    channel.sendall(sent)
    status, response_headers, content = 0, [], b""
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(channel.recv(CHUNK))
        elif isinstance(event, h11.Response):
            status, response_headers = event.status_code, list(event.headers)
        elif isinstance(event, h11.Data):
            content += bytes(event.data)
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, response_headers, content

"""A paramiko channel seen from asyncio: a socket pair, with two threads moving the bytes.

Channels block; the event loop must not. Each direction has a thread of its own, so a slow
reader on one side never stalls the other direction.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import paramiko

CHUNK = 65536


class ChannelPipe:
    def __init__(self, channel: paramiko.Channel, on_close: Callable[[], None]) -> None:
        self._channel = channel
        self._on_close = on_close
        self._ours, self._theirs = socket.socketpair()
        self._lock = threading.Lock()
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
        with self._lock:
            if self._on_close is None:
                return
            on_close, self._on_close = self._on_close, None  # type: ignore[assignment]
        self._channel.close()
        self._ours.close()
        on_close()

"""One Redis connection on which the agents' server sends every beat's script, pipelined.

redis.asyncio spends about 80 us of the process's CPU on each command it sends (taking a
connection from the pool and giving it back, a timeout, retries, its events), four fifths of
what a beat costs the server besides HTTP (docs/benchmarks.md). Here a beat's command is packed
and written on one connection kept by the process, and a single reader hands the answers, which
Redis sends in the order of the commands, to the beats waiting for them: about 20 us. The
connection is the client's own kind (made by its pool: the same address, sentinels, TLS,
password and database); commands that wait longer than the client's socket timeout drop it and
fail, as they would through the client, and the next command connects again. A command is
packed here (``packed``): redis-py's packing, an encoder call an argument, took 12-20 us of a
beat's 17 arguments, this 4-6. The commands of one turn of the event loop go in one write:
under load, a write a beat was a sixth of the server's time (server CPU a beat under wrk 108 ->
92 us; docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# How often the waiting commands' age is checked (seconds).
WATCH = 0.5


class PipelinedScript:
    """A Lua script run with EVALSHA on a pipelined connection of ``client``'s kind."""

    def __init__(self, client: redis.asyncio.Redis, script: str) -> None:
        self.script = script
        self.sha: str = client.register_script(script).sha
        self.pool = client.connection_pool
        self.timeout = float(self.pool.connection_kwargs.get("socket_timeout") or 5)
        self.connection: AbstractConnection | None = None
        self.connecting: asyncio.Lock | None = None
        # Each command's answer and when it was sent, in the order sent.
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        # Commands packed and not yet written: the first one's sender writes them all.
        self.unsent: list[bytes] = []
        self.flushing: set[asyncio.Task[None]] = set()
        self.reader: asyncio.Task[None] | None = None
        self.watcher: asyncio.Task[None] | None = None

    async def __call__(
        self, *, keys: Sequence[str], args: Sequence[str | int | float | bytes]
    ) -> Any:
        try:
            return await self._send("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # Redis lost its scripts (a restart, a failover): load it and send again.
            await self._send("SCRIPT", "LOAD", self.script)
            return await self._send("EVALSHA", self.sha, len(keys), *keys, *args)

    async def close(self) -> None:
        for task in (self.reader, self.watcher):
            if task is not None:
                task.cancel()
        if self.connection is not None:
            await self.connection.disconnect()
            self.connection = None
        self.unsent = []
        self._fail(RedisConnectionError("closed"))

    async def _send(self, *command: str | int | float | bytes) -> Any:
        connection = self.connection
        if connection is None or not connection.is_connected:
            connection = await self._connect()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        # Appended to both with nothing awaited between: written, and answered, in this order.
        self.waiting.append((answer, loop.time()))
        self.unsent.append(packed(*command))
        if len(self.unsent) == 1:
            # The beats the loop runs in this turn add theirs: one write for them all, where a
            # write a beat was a sixth of the server's time under load.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                # This caller is cancelled, not the others whose commands wait with its own.
                flushing = loop.create_task(self._flush(connection))
                self.flushing.add(flushing)
                flushing.add_done_callback(self.flushing.discard)
                raise
            await self._flush(connection)
        return await answer

    async def _flush(self, connection: AbstractConnection) -> None:
        if connection is not self.connection:  # dropped, and what was unsent with it
            return
        data, self.unsent = b"".join(self.unsent), []
        try:
            await connection.send_packed_command(data, check_health=False)
        except RedisError as exc:
            self._drop(exc)

    async def _connect(self) -> AbstractConnection:
        if self.connecting is None:
            self.connecting = asyncio.Lock()
        async with self.connecting:
            connection = self.connection
            if connection is not None and connection.is_connected:
                return connection
            connection = self.pool.make_connection()
            # Waits are bounded by the watcher, for every command at once.
            connection.socket_timeout = None
            await connection.connect()
            self.connection = connection
            loop = asyncio.get_running_loop()
            self.reader = loop.create_task(self._read(connection))
            if self.watcher is None:
                self.watcher = loop.create_task(self._watch())
            return connection

    async def _read(self, connection: AbstractConnection) -> None:
        while True:
            try:
                answer = await connection.read_response(timeout=math.inf)
            except ResponseError as exc:
                if self.waiting:
                    _settle(self.waiting.popleft()[0], exc)
                continue
            except (RedisError, OSError) as exc:
                if connection is self.connection:
                    self._drop(exc)
                return
            if self.waiting:
                _settle(self.waiting.popleft()[0], answer)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH)
            if self.waiting and loop.time() - self.waiting[0][1] > self.timeout:
                self._drop(RedisTimeoutError("Timeout reading from Redis"))

    def _drop(self, exc: Exception) -> None:
        """Give up the connection: every command waiting on it fails with ``exc``."""
        connection, self.connection = self.connection, None
        self.unsent = []
        if self.reader is not None:
            self.reader.cancel()
            self.reader = None
        if connection is not None:
            log.warning("pipelined Redis connection dropped: %s", exc)
            asyncio.get_running_loop().create_task(connection.disconnect(nowait=True))
        self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        while self.waiting:
            _settle(self.waiting.popleft()[0], exc)


def packed(*command: str | int | float | bytes) -> bytes:
    """``command`` in Redis's protocol (RESP), each argument a bulk string as redis-py sends it:
    bytes as they are, text in UTF-8, numbers written out."""
    parts = [b"*%d\r\n" % len(command)]
    for argument in command:
        if isinstance(argument, bytes):
            value = argument
        elif isinstance(argument, str):
            value = argument.encode()
        elif isinstance(argument, int | float) and not isinstance(argument, bool):
            value = repr(argument).encode()
        else:
            raise TypeError(f"not a Redis argument: {argument!r}")
        parts.append(b"$%d\r\n%b\r\n" % (len(value), value))
    return b"".join(parts)


def _settle(answer: asyncio.Future[Any], outcome: object) -> None:
    if answer.done():
        return
    if isinstance(outcome, BaseException):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)

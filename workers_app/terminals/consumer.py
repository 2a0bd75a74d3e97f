"""The terminal's WebSocket end: frames in and out of a stream, nothing more.

Protocol. The client's first message is text: {"type": "start", "command": [...], "pty": bool,
"cols": N, "rows": N}. Then binary frames are input; text frames are {"type": "resize", "cols",
"rows"} or {"type": "eof"}. The server sends {"type": "started"}, then binary frames whose first
byte says the stream (1 stdout, 2 stderr), then {"type": "exit", "status": N} and closes with
1000; a refusal is {"type": "error", "code", "message"} and a close with that code (4404 for a
worker that is not the user's: the cluster is never reached).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from core import metrics as families
from core.transport.errors import SSHError
from core.transport.streams import Stream
from identity import revocations
from workers_app.idle import note_traffic
from workers_app.terminals.service import (
    ALIVE_FOR,
    BAD_REQUEST,
    FORBIDDEN_ORIGIN,
    TIMED_OUT,
    UNAUTHENTICATED,
    UNAVAILABLE,
    TerminalRefused,
    close_terminal,
    find_worker,
    note_alive,
    parse_resize,
    parse_start,
    record_opening,
    start_stream,
)

START_WITHIN = 15.0
WATCH_EVERY = 1.0
OUTBOX_FRAMES = 64


class TerminalConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.stream: Stream | None = None
        self.counted = False
        self.record_id: int | None = None
        self.alive_noted = 0.0
        self.starting = False
        self.finished = False
        self.connected_at = self.last_activity = self.owner_checked = time.monotonic()
        self.outbox: asyncio.Queue[bytes | tuple[str, int | None]] = asyncio.Queue(OUTBOX_FRAMES)
        self.loop = asyncio.get_running_loop()
        self.tasks: list[asyncio.Task[None]] = []
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(UNAUTHENTICATED, "Log in, or send an API key.")
            return
        if self.scope.get("origin_refused"):
            await self.refuse(FORBIDDEN_ORIGIN, "This page's origin may not open terminals.")
            return
        self.user = user
        self.public_id = str(self.scope["url_route"]["kwargs"]["public_id"])
        try:
            # Before anything else: someone else's worker ends here, the cluster never asked.
            await database_sync_to_async(find_worker)(user, self.public_id)
        except TerminalRefused as exc:
            await self.refuse(exc.code, exc.message)
            return
        self.tasks = [asyncio.create_task(self.pump()), asyncio.create_task(self.watch())]

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.finished:
            return
        if not self.starting:
            self.starting = True
            await self.start(text_data)
            return
        if self.stream is None:
            return  # input typed while the command starts is dropped, as ssh does
        self.last_activity = time.monotonic()
        note_traffic(self.worker_id)
        try:
            if bytes_data is not None:
                self.stream.write(bytes_data)
            elif text_data is not None:
                self.control(json.loads(text_data))
        except (ValueError, TypeError, AttributeError):
            await self.refuse(BAD_REQUEST, "Control messages are JSON objects with a type.")
        except TerminalRefused as exc:
            await self.refuse(exc.code, exc.message)
        except SSHError as exc:
            await self.refuse(UNAVAILABLE, str(exc))

    def control(self, message: dict[str, Any]) -> None:
        assert self.stream is not None
        kind = message.get("type")
        if kind == "resize":
            self.stream.resize(*parse_resize(message))
        elif kind == "eof":
            self.stream.end_input()
        else:
            raise TerminalRefused(BAD_REQUEST, f"Unknown message type {kind!r}.")

    async def start(self, text_data: str | None) -> None:
        try:
            if text_data is None:
                raise TerminalRefused(BAD_REQUEST, "The first message must be a start message.")
            request = parse_start(text_data)
            record, worker = await database_sync_to_async(record_opening)(
                self.user, self.public_id, request
            )
        except TerminalRefused as exc:
            await self.refuse(exc.code, exc.message)
            return
        self.record_id = record.pk
        self.worker_id = worker.pk
        self.alive_noted = time.monotonic()
        await asyncio.to_thread(note_alive, record.pk)
        try:
            stream = await asyncio.to_thread(start_stream, worker, request)
        except TerminalRefused as exc:
            await self.refuse(exc.code, exc.message)
            return
        self.stream = stream
        if self.finished:  # the client left while the command was starting
            await asyncio.to_thread(stream.close)
            await self.record_close(None, "the client left")
            return
        self.counted = True
        families.TERMINALS_OPEN.inc()
        await self.send(text_data=json.dumps({"type": "started", "terminal": record.pk}))
        self.last_activity = time.monotonic()
        stream.start(self.on_output, self.on_end)

    # Called on the stream's reader thread.
    def on_output(self, stream_id: int, data: bytes) -> None:
        self.hand_over(bytes([stream_id]) + data)

    def on_end(self, status: int | None) -> None:
        self.hand_over(("end", status))

    def hand_over(self, item: bytes | tuple[str, int | None]) -> None:
        # Waits while the browser is slow to take output: that back-pressure reaches the
        # command through the SSH window instead of piling up here.
        while not self.finished:
            future = asyncio.run_coroutine_threadsafe(self.outbox.put(item), self.loop)
            try:
                future.result(timeout=1.0)
                return
            except concurrent.futures.TimeoutError:
                future.cancel()
            except RuntimeError:
                return  # the event loop is gone: the server is stopping

    async def pump(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, bytes):
                self.last_activity = time.monotonic()
                note_traffic(self.worker_id)
                await self.send(bytes_data=item)
                continue
            status = item[1]
            if status is None and await self.owner_disabled():
                await self.refuse(UNAUTHENTICATED, "Your account was disabled.")
                return
            if status is None:
                await self.refuse(UNAVAILABLE, "The connection to the cluster was lost.")
                return
            await self.send(text_data=json.dumps({"type": "exit", "status": status}))
            await self.finish(1000, None, f"exited with {status}", status)
            return

    async def watch(self) -> None:
        idle = settings.ACTIVATE_TERMINAL_IDLE_TIMEOUT
        longest = settings.ACTIVATE_TERMINAL_MAX_DURATION
        while not self.finished:
            await asyncio.sleep(WATCH_EVERY)
            now = time.monotonic()
            if self.record_id is not None and now - self.alive_noted >= ALIVE_FOR / 4:
                self.alive_noted = now
                await asyncio.to_thread(note_alive, self.record_id)
            if self.stream is None and not self.starting and now - self.connected_at > START_WITHIN:
                await self.refuse(TIMED_OUT, "No start message came.")
            elif self.stream is not None and now - self.last_activity > idle:
                await self.refuse(TIMED_OUT, f"Closed after {idle:g} s without input or output.")
            elif now - self.connected_at > longest:
                await self.refuse(TIMED_OUT, f"Closed after {longest:g} s, the longest allowed.")
            elif now - self.owner_checked >= revocations.CHECK_EVERY:
                self.owner_checked = now
                if await self.owner_disabled():
                    await self.refuse(UNAUTHENTICATED, "Your account was disabled.")

    async def owner_disabled(self) -> bool:
        try:
            return await asyncio.to_thread(revocations.is_disabled, self.user.pk)
        except redis.RedisError:
            return False  # checked again next time; the platform's login is refused anyway

    async def refuse(self, code: int, message: str) -> None:
        if self.finished:
            return
        await self.send(text_data=json.dumps({"type": "error", "code": code, "message": message}))
        await self.finish(code, message, message, None)

    async def finish(self, code: int, reason: str | None, why: str, status: int | None) -> None:
        if self.finished:
            return
        self.finished = True
        await self.close(code=code, reason=reason[:120] if reason else None)
        await self.release(why, status)

    async def release(self, why: str, status: int | None) -> None:
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        if self.counted:
            self.counted = False
            families.TERMINALS_OPEN.dec()
        if self.stream is not None:
            await asyncio.to_thread(self.stream.close)
        await self.record_close(status, why)

    async def record_close(self, status: int | None, why: str) -> None:
        if self.record_id is not None:
            await database_sync_to_async(close_terminal)(
                self.record_id, exit_status=status, reason=why
            )

    async def disconnect(self, code: int) -> None:
        if self.finished:
            return
        self.finished = True
        await self.release(f"the client closed ({code})", None)

"""A WebSocket whose messages are a byte stream on the node: noVNC's VNC connection, carried
to the X server's private socket behind the gate (what websockify did on the node, where it
needed a port of its own that every user of the node could reach)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from sessions_app import metrics
from sessions_app.proxy.target import Target, open_pipe

CHUNK = 65536


class Consumer(Protocol):
    scope: dict[str, object]

    async def accept(self, subprotocol: str | None = None) -> None: ...

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None: ...

    async def close(self, code: int | None = None) -> None: ...


class RawBridge:
    def __init__(self, consumer: Consumer, writer: asyncio.StreamWriter, target: Target) -> None:
        self.consumer = consumer
        self.writer = writer
        self.target = target
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, consumer: Consumer, target: Target, route: str) -> RawBridge:
        """Raises what open_pipe raises (SSHError) when the program cannot be reached."""
        reader, writer = await open_pipe(target, route)
        bridge = cls(consumer, writer, target)
        offered = list(consumer.scope.get("subprotocols") or [])  # type: ignore[call-overload]
        await consumer.accept(subprotocol="binary" if "binary" in offered else None)
        bridge.task = asyncio.create_task(bridge._to_browser(reader))
        return bridge

    async def _to_browser(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(CHUNK):
                self.target.note_traffic()
                metrics.to_browser(self.target.kind.name, len(data))
                await self.consumer.send(bytes_data=data)
        except (ConnectionError, OSError):
            pass
        await self.consumer.close()

    async def from_browser(self, data: bytes) -> None:
        self.target.note_traffic()
        metrics.to_node(self.target.kind.name, len(data))
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            await self.consumer.close()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        with contextlib.suppress(Exception):
            self.writer.close()

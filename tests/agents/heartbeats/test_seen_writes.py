"""The agents' server writes "last seen" grouped and off the beats' answers: a beat notes its
worker and goes on at once; beats noted while a write is under way share the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from django.db import OperationalError

from agents import asgi
from agents.asgi import SeenWrites


def test_a_beat_is_not_held_by_the_write_and_those_noted_meanwhile_share_the_next() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def write(worker_ids: list[int]) -> None:
            written.append(worker_ids)
            await release.wait()

        seen = SeenWrites(write)
        # Given a write for worker 1 under way, which PostgreSQL does not finish
        seen.note(1)
        await asyncio.sleep(0)
        assert written == [[1]]
        # When workers 3 and 2 are noted meanwhile: noting returned without waiting for it
        seen.note(3)
        seen.note(2)
        await asyncio.sleep(0)
        assert written == [[1]]
        release.set()
        await asyncio.wait_for(seen.close(), timeout=5)

    asyncio.run(scenario())
    # Then they were written together, after the first
    assert written == [[1], [2, 3]]


def test_a_failed_write_is_logged_and_the_next_is_written() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        async def write(worker_ids: list[int]) -> None:
            written.append(worker_ids)
            if len(written) == 1:
                raise OperationalError("the database went away")

        seen = SeenWrites(write)
        seen.note(1)
        await asyncio.wait_for(seen.close(), timeout=5)
        seen.note(2)
        await asyncio.wait_for(seen.close(), timeout=5)

    asyncio.run(scenario())
    assert written == [[1], [2]]


def test_a_server_shutting_down_gives_a_write_that_hangs_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(asgi, "SHUTDOWN_WRITE", 0.2)

    async def scenario() -> list[str]:
        async def never_done(worker_ids: list[int]) -> None:
            await asyncio.Event().wait()

        server = asgi.AgentServer(django_application=_no_django)
        server.seen = SeenWrites(never_done)
        messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        sent: list[str] = []

        async def send(message: Mapping[str, Any]) -> None:
            sent.append(message["type"])

        running = asyncio.create_task(server(_lifespan_scope(), messages.get, send))
        await messages.put({"type": "lifespan.startup"})
        await asyncio.sleep(0.1)
        server.seen.note(1)
        await messages.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(running, timeout=5)
        return sent

    # Given a "last seen" write PostgreSQL never finishes, when the server shuts down
    sent = asyncio.run(scenario())
    # Then it completes its shutdown anyway
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def _no_django(scope: object, receive: object, send: object) -> None:
    raise AssertionError("not for Django")


def _lifespan_scope() -> dict[str, Any]:
    return {"type": "lifespan"}

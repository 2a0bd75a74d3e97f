"""The agents' server writes "last seen" grouped and off the beats' answers: a beat notes its
worker and goes on at once; beats noted while a write is under way share the next one."""

from __future__ import annotations

import asyncio

from django.db import OperationalError

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

"""The agents' server writes "last seen" grouped: beats that need it while a write is under way
share the next one, and each beat is answered only once its own worker is written."""

from __future__ import annotations

import asyncio

from django.db import OperationalError

from agents.asgi import SeenWrites


def test_beats_arriving_during_a_write_share_the_next_one() -> None:
    written: list[list[int]] = []

    async def scenario() -> list[int]:
        release = asyncio.Event()

        async def write(worker_ids: list[int]) -> None:
            written.append(worker_ids)
            await release.wait()

        seen = SeenWrites(write)
        answered: list[int] = []

        async def beat(worker_id: int) -> None:
            await seen.note(worker_id)
            answered.append(worker_id)

        # Given a write for worker 1 under way
        first = asyncio.create_task(beat(1))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        # When workers 3 and 2 need one meanwhile
        others = [asyncio.create_task(beat(3)), asyncio.create_task(beat(2))]
        await asyncio.sleep(0)
        assert answered == []  # nobody is answered before the write is done
        release.set()
        await asyncio.gather(first, *others)
        return answered

    answered = asyncio.run(scenario())
    # Then they were written together, after the first, and every beat was answered
    assert written == [[1], [2, 3]]
    assert sorted(answered) == [1, 2, 3]


def test_a_failed_write_still_answers_its_beats_and_the_next_is_written() -> None:
    written: list[list[int]] = []

    async def scenario() -> None:
        async def write(worker_ids: list[int]) -> None:
            written.append(worker_ids)
            if len(written) == 1:
                raise OperationalError("the database went away")

        seen = SeenWrites(write)
        await asyncio.wait_for(seen.note(1), timeout=5)
        await asyncio.wait_for(seen.note(2), timeout=5)

    asyncio.run(scenario())
    assert written == [[1], [2]]

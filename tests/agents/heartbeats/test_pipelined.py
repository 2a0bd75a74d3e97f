"""The beat script on one pipelined connection (agents/pipelined.py), against the real Redis:
each caller gets its own answer, a Redis that lost its scripts or the connection is got back,
and a Redis that stops answering fails the waiting calls instead of holding them."""

from __future__ import annotations

import asyncio
import random
import secrets

import pytest
import redis.asyncio
from django.conf import settings
from redis.exceptions import TimeoutError as RedisTimeoutError

from agents.pipelined import PipelinedScript, packed
from core.redis_connection import async_redis_client, redis_client

ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"


def test_concurrent_calls_each_get_their_own_answer() -> None:
    async def scenario() -> list[bytes]:
        client = async_redis_client()
        script = PipelinedScript(client, ECHO)

        async def call(n: int) -> bytes:
            # Spread over many turns of the loop, so sends and answers interleave.
            await asyncio.sleep(random.random() / 100)
            answer: bytes = await script(keys=["test:pipelined"], args=[str(n)])
            return answer

        try:
            return await asyncio.gather(*(call(n) for n in range(500)))
        finally:
            await script.close()
            await client.aclose()

    assert asyncio.run(scenario()) == [str(n).encode() for n in range(500)]


def test_a_script_redis_does_not_know_is_loaded_and_a_lost_connection_is_made_again() -> None:
    name = f"test-pipelined-{secrets.token_hex(4)}"

    async def scenario() -> list[bytes]:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, client_name=name)
        # Given a script Redis has never been sent (as after a restart: EVALSHA finds nothing)
        script = PipelinedScript(client, f"-- {name}\n{ECHO}")
        answers = []
        try:
            answers.append(await script(keys=["test:pipelined"], args=["1"]))
            # Given then the connection killed by Redis (the connection pipelined, by its name)
            (mine,) = [c for c in redis_client().client_list() if c["name"] == name]
            redis_client().client_kill_filter(_id=mine["id"])
            await asyncio.sleep(0.1)
            for n in (2, 3):
                try:
                    answers.append(await script(keys=["test:pipelined"], args=[str(n)]))
                except redis.exceptions.ConnectionError:
                    answers.append(b"failed")
            return answers
        finally:
            await script.close()
            await client.aclose()

    answers = asyncio.run(scenario())
    # Then every call is answered, but at most the one that found the connection dead
    assert answers[0] == b"1"
    assert answers[2] == b"3"
    assert answers[1] in (b"2", b"failed")


async def _going_silent(commands: list[bytes]) -> asyncio.Server:
    """A proxy to the real Redis that passes a client's set-up and drops what it sends from its
    first EVALSHA on: a Redis that stopped answering."""
    address = redis_client().connection_pool.connection_kwargs

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream = await asyncio.open_connection(address["host"], address["port"])

        async def answers() -> None:
            while data := await upstream_reader.read(65536):
                writer.write(data)

        relay = asyncio.get_running_loop().create_task(answers())
        silent = False
        while data := await reader.read(65536):
            commands.append(data)
            silent = silent or b"EVALSHA" in data
            if not silent:
                upstream.write(data)
        relay.cancel()
        upstream.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("waiting", [1, 20])
def test_calls_redis_does_not_answer_fail_after_the_socket_timeout(waiting: int) -> None:
    commands: list[bytes] = []

    async def scenario() -> tuple[list[object], float]:
        server = await _going_silent(commands)
        port = server.sockets[0].getsockname()[1]
        client = redis.asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=0.5)
        script = PipelinedScript(client, ECHO)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            calls = [script(keys=["k"], args=[str(n)]) for n in range(waiting)]
            outcomes = await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), timeout=10
            )
            return outcomes, loop.time() - started
        finally:
            await script.close()
            server.close()

    outcomes, took = asyncio.run(scenario())
    assert all(isinstance(outcome, RedisTimeoutError) for outcome in outcomes), outcomes
    assert 0.5 <= took < 2, took


def test_commands_are_packed_as_redis_py_packs_them_and_redis_reads_each_argument_whole() -> None:
    # Given arguments of every kind a beat sends: text (non-ASCII too), numbers, bytes, empty
    arguments: list[str | int | float | bytes] = ["k", "héllo\r\n$3", 120000, 0.25, b"\x00\xff", ""]
    connection = redis_client().connection_pool.make_connection()
    # Then the bytes are redis-py's own, and a script sees each argument as it was given
    assert packed("ECHO", *arguments) == b"".join(connection.pack_command("ECHO", *arguments))

    async def scenario() -> list[bytes]:
        client = async_redis_client()
        script = PipelinedScript(client, "return ARGV")
        try:
            answer: list[bytes] = await script(keys=[], args=arguments)
            return answer
        finally:
            await script.close()
            await client.aclose()

    assert asyncio.run(scenario()) == [
        b"k",
        "héllo\r\n$3".encode(),
        b"120000",
        b"0.25",
        b"\x00\xff",
        b"",
    ]
    with pytest.raises(TypeError):
        packed("ECHO", True)


def test_the_commands_of_one_turn_of_the_loop_go_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a count of the writes on the pipelined connection
    writes: list[int] = []
    sending = redis.asyncio.Connection.send_packed_command

    async def counted(self: redis.asyncio.Connection, command: object, **kwargs: object) -> None:
        writes.append(1)
        await sending(self, command, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.asyncio.Connection, "send_packed_command", counted)

    async def scenario() -> list[bytes]:
        client = async_redis_client()
        script = PipelinedScript(client, ECHO)
        try:
            await script(keys=["test:pipelined"], args=["warm"])  # connected
            writes.clear()
            # When 200 calls start in the same turn of the loop
            return await asyncio.gather(
                *(script(keys=["test:pipelined"], args=[str(n)]) for n in range(200))
            )
        finally:
            await script.close()
            await client.aclose()

    # Then each got its own answer, and all went in one write
    assert asyncio.run(scenario()) == [str(n).encode() for n in range(200)]
    assert len(writes) == 1


def test_a_caller_cancelled_before_the_write_leaves_the_others_commands_going() -> None:
    async def scenario() -> list[bytes]:
        client = async_redis_client()
        script = PipelinedScript(client, ECHO)
        try:
            await script(keys=["test:pipelined"], args=["warm"])
            # Given the first caller of a turn (the one that writes), cancelled before it writes
            first = asyncio.ensure_future(script(keys=["test:pipelined"], args=["first"]))
            others = [
                asyncio.ensure_future(script(keys=["test:pipelined"], args=[str(n)]))
                for n in range(5)
            ]
            await asyncio.sleep(0)
            first.cancel()
            # Then the others still get their answers, and so do later callers
            answers = list(await asyncio.wait_for(asyncio.gather(*others), 2))
            answers.append(await asyncio.wait_for(script(keys=["t"], args=["later"]), 2))
            return answers
        finally:
            await script.close()
            await client.aclose()

    assert asyncio.run(scenario()) == [*(str(n).encode() for n in range(5)), b"later"]

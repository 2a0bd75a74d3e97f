"""A reference for the heartbeat benchmark: a plain ASGI callable doing one Redis SET with
redis.asyncio, no checks at all (about the most Python serves per request on this stack).

    uvicorn bench.bare_asgi:application   (REDIS_URL from the environment)
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import redis.asyncio

client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=5)
OK = b'{"status": "ok"}'


async def application(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[Mapping[str, Any]]],
    send: Callable[[Mapping[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body", False):
        pass
    await client.set("bench:bare-asgi-beat", 1, px=30_000)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(OK))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": OK})

"""Commands run through the API are served from a pool of threads of their own: a command holds
its thread for minutes, and must never take one that pages and the API answer on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from activate import asgi
from activate.routing import HttpRouter


def test_the_shipped_application_gives_commands_their_own_pool() -> None:
    assert asgi.exec_application is not asgi.django_application
    assert asgi.exec_application.executor is not asgi.django_application.executor


@pytest.mark.parametrize(
    ("path", "served_by"),
    [
        ("/api/workers/wabc/exec/", "exec"),
        ("/api/workers/wabc/exec", "exec"),
        ("/api/workers/", "django"),
        ("/api/workers/wabc/", "django"),
        ("/api/workers/wabc/events/", "django"),
        ("/workers/wabc/exec/", "django"),
    ],
)
def test_only_the_exec_endpoint_goes_to_the_commands_pool(path: str, served_by: str) -> None:
    seen: list[str] = []

    def app(name: str) -> Any:
        async def serve(scope: Any, receive: Any, send: Any) -> None:
            seen.append(name)

        return serve

    router = HttpRouter(app("django"), app("exec"))
    scope = {"type": "http", "path": path, "headers": [(b"host", b"127.0.0.1:8000")]}
    asyncio.run(router(scope, None, None))
    assert seen == [served_by]

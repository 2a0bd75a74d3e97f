"""What the tests' own broker database holds: the messages published, oldest first."""

from __future__ import annotations

import base64
import json
from typing import Any

from core.redis_connection import redis_client

QUEUE = "celery"


def queued_messages() -> list[tuple[str, list[Any]]]:
    """(task name, arguments) of each message waiting in the default queue."""
    raw = reversed(redis_client().lrange(QUEUE, 0, -1))  # LPUSHed: newest first
    messages = [json.loads(item) for item in raw]
    return [
        (message["headers"]["task"], json.loads(base64.b64decode(message["body"]))[0])
        for message in messages
    ]

"""The process-wide Redis client: heartbeats, locks and the health check share it."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def redis_client() -> redis.Redis:
    return _client(settings.REDIS_URL)

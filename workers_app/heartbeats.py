"""Heartbeats live in Redis as keys with a TTL; the database is written only on connect.

The store keeps an "epoch" key with no TTL. If Redis loses its data (restart, flush,
failover), the epoch is gone too, and the sweep gives connected workers a fresh grace
period instead of declaring them all disconnected.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from django.conf import settings

PREFIX = "activate:hb:"
EPOCH_KEY = "activate:hb-epoch"
AGENT_PREFIX = "activate:agent:"


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def redis_client() -> redis.Redis:
    return _client(settings.REDIS_URL)


@dataclass(frozen=True)
class AgentIdentity:
    """What a heartbeat needs to know about a worker, cached so a beat never reads the DB."""

    worker_id: int
    secret_hash: str


class HeartbeatStore:
    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()
        self.ttl_ms = int(settings.ACTIVATE_HEARTBEAT_TIMEOUT * 1000)

    def beat(self, worker_id: int) -> None:
        self.redis.set(f"{PREFIX}{worker_id}", 1, px=self.ttl_ms)

    def beat_many(self, worker_ids: Iterable[int]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.set(f"{PREFIX}{worker_id}", 1, px=self.ttl_ms)
        pipe.execute()

    def alive(self, worker_ids: list[int]) -> set[int]:
        if not worker_ids:
            return set()
        values = self.redis.mget([f"{PREFIX}{w}" for w in worker_ids])
        return {w for w, v in zip(worker_ids, values, strict=True) if v is not None}

    def forget(self, worker_id: int, public_id: str = "") -> None:
        keys = [f"{PREFIX}{worker_id}"] + ([f"{AGENT_PREFIX}{public_id}"] if public_id else [])
        self.redis.delete(*keys)

    def intact(self) -> bool:
        """False when Redis lost its data since the epoch was written."""
        return bool(self.redis.exists(EPOCH_KEY))

    def claim_reset(self) -> bool:
        """Write a new epoch; exactly one caller wins and must grant the grace period."""
        return bool(self.redis.set(EPOCH_KEY, 1, nx=True))

    def remember_agent(self, public_id: str, identity: AgentIdentity) -> None:
        self.redis.set(
            f"{AGENT_PREFIX}{public_id}",
            f"{identity.worker_id}:{identity.secret_hash}",
            px=self.ttl_ms * 10,
        )

    def beat_agent(self, public_id: str) -> AgentIdentity | None:
        """Look up a cached agent identity; None means the caller must ask the database."""
        raw = self.redis.get(f"{AGENT_PREFIX}{public_id}")
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        worker_id, secret_hash = text.split(":", 1)
        return AgentIdentity(int(worker_id), secret_hash)

"""Whether workers are alive, as the heartbeat sweep sees it: keys in Redis with a TTL.

The agents' server writes a worker's liveness key at every beat (agents/beats.py); the sweep
reads them and stops the workers whose key expired. The store keeps an "epoch" key with no TTL.
If Redis loses its data (restart, flush, failover), the epoch is gone too, and the sweep gives
connected workers a fresh grace period instead of declaring them all disconnected.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis
from django.conf import settings

from core.redis_connection import redis_client

# A worker's liveness key (PREFIX<worker pk>), set at every beat with the heartbeat timeout.
PREFIX = "activate:hb:"
EPOCH_KEY = "activate:hb-epoch"
# The agents' server caches a worker's identity (AGENT_PREFIX<public id>) so a beat never
# reads the database; a worker that stops forgets it with its liveness key.
AGENT_PREFIX = "activate:agent:"
# When the heartbeat sweep last completed, and whether the platform was found deaf since.
LAST_SWEEP_KEY = "activate:hb-last-sweep"
DEAF_KEY = "activate:hb-deaf"
BREAKER_PREFIX = "activate:hb-breaker:"
# Beats the agents' server shed (a hash: "count" in the window, "last" Redis's time of the last
# note) kept for a heartbeat timeout after each note, and their total since Redis began.
SHED_PREFIX = "activate:hb-shed:"
CONFIRM_PREFIX = "activate:hb-confirm:"


def liveness_ttl_ms() -> int:
    """How long a beat keeps a worker alive."""
    return int(settings.ACTIVATE_HEARTBEAT_TIMEOUT * 1000)


class Liveness:
    """The workers' liveness keys and the epoch that tells whether Redis kept them."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()
        self.ttl_ms = liveness_ttl_ms()

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


class SweepRecord:
    """What the sweep knows about the platform's own hearing: when it last completed, and
    whether agents could not reach the platform since."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()

    def last_sweep(self) -> float | None:
        value = self.redis.get(LAST_SWEEP_KEY)
        return float(value) if value is not None else None

    def note_sweep(self, at: float) -> None:
        self.redis.set(LAST_SWEEP_KEY, repr(at))

    def mark_deaf(self) -> None:
        self.redis.set(DEAF_KEY, 1)

    def clear_deaf(self) -> bool:
        """Whether the platform had been deaf (exactly one caller sees True)."""
        return bool(self.redis.delete(DEAF_KEY))


def _shed_key() -> str:
    return f"{SHED_PREFIX}{settings.ACTIVATE_INSTALLATION_ID}"


# One round trip, on Redis's clock: the window lasts a heartbeat timeout from the last note.
NOTE_SHED = """
local clock = redis.call('TIME')
redis.call('HINCRBY', KEYS[1], 'count', ARGV[1])
redis.call('HSET', KEYS[1], 'last', clock[1] .. '.' .. string.format('%06d', clock[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('INCRBY', KEYS[2], ARGV[1])
"""


class ShedRecord:
    """Beats the agents' server shed (answered "retry after N s" with nothing done), as the
    heartbeat sweep reads them: like a relay that shed calls (relays.note_shedding), the
    platform counts nobody's silence for a heartbeat timeout after it last shed, since the
    silence may be a beat it refused."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()
        self.key = _shed_key()
        self.total_key = f"{self.key}:total"

    def note_arguments(self, count: int) -> tuple[list[str], list[int]]:
        """NOTE_SHED's keys and arguments for ``count`` beats shed (the agents' server runs it
        with redis.asyncio)."""
        return [self.key, self.total_key], [count, liveness_ttl_ms()]

    def note(self, count: int) -> None:
        keys, args = self.note_arguments(count)
        self.redis.eval(NOTE_SHED, len(keys), *keys, *args)

    def shed_lately(self) -> bool:
        """Whether beats were shed within the last heartbeat timeout."""
        return bool(self.redis.exists(self.key))

    def window(self) -> tuple[int, float | None]:
        """Beats shed in the current window and Redis's time of the last (0, None: none)."""
        values = self.redis.hmget(self.key, ["count", "last"])
        count, last = values
        return int(count or 0), float(last) if last is not None else None

    def total(self) -> int:
        return int(self.redis.get(self.total_key) or 0)


class Breakers:
    """Clusters whose workers went silent too many at once: held until an operator confirms."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()

    def open(self, cluster_id: int, *, silent: int, connected: int, at: float) -> None:
        self.redis.set(
            f"{BREAKER_PREFIX}{cluster_id}",
            json.dumps({"silent": silent, "connected": connected, "since": at}),
            nx=True,
        )

    def close(self, cluster_id: int) -> None:
        self.redis.delete(f"{BREAKER_PREFIX}{cluster_id}", f"{CONFIRM_PREFIX}{cluster_id}")

    def all_open(self) -> dict[int, dict[str, float]]:
        keys = list(self.redis.scan_iter(match=f"{BREAKER_PREFIX}*", count=1000))
        values = self.redis.mget(keys) if keys else []
        return {
            int(key.decode().removeprefix(BREAKER_PREFIX)): json.loads(value)
            for key, value in zip(keys, values, strict=True)
            if value is not None
        }

    def confirm(self, cluster_id: int) -> None:
        """An operator says the silence is real: the next sweep stops those workers."""
        self.redis.set(f"{CONFIRM_PREFIX}{cluster_id}", 1, ex=3600)

    def is_confirmed(self, cluster_id: int) -> bool:
        return bool(self.redis.exists(f"{CONFIRM_PREFIX}{cluster_id}"))

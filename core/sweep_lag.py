"""Sweep lag: seconds since each kind of sweep last completed, kept in Redis.

Each sweep task notes its completion; ``sweep_lag`` reads them all in one round trip for
/health/ and the metrics. A lag growing well past its sweep's interval means sweeps stopped:
no sweeper consuming, no beat holding the lease, or the database or Redis away.
"""

from __future__ import annotations

import logging
import time

import redis

from core.redis_connection import redis_client

log = logging.getLogger(__name__)
DONE_KEY = "activate:sweep-done:"
KINDS = ("timeouts", "heartbeats", "idle", "sessions", "idle_sessions", "terminals")


def note_completed(kind: str, *, at: float | None = None) -> None:
    if kind not in KINDS:
        raise ValueError(f"not a kind of sweep: {kind!r}")
    try:
        redis_client().set(f"{DONE_KEY}{kind}", repr(time.time() if at is None else at))
    except redis.RedisError as exc:
        # The sweep's own work is done; its lag just keeps growing until a note gets through.
        log.warning("could not note the %s sweep's completion: %s", kind, exc)


def sweep_lag(*, now: float | None = None) -> dict[str, float | None]:
    """Seconds since each kind of sweep last completed (None: never, as far as Redis knows).
    Raises redis.RedisError when Redis does not answer."""
    now = time.time() if now is None else now
    values = redis_client().mget([f"{DONE_KEY}{kind}" for kind in KINDS])
    return {
        kind: None if value is None else round(max(0.0, now - float(value)), 1)
        for kind, value in zip(KINDS, values, strict=True)
    }

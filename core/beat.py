"""Celery beat on every host, one sending at a time: a lease in Redis.

Each beat process keeps its schedule as usual but sends due tasks only while it holds the lease
(``activate:beat-lease:<installation>``: SET NX PX with a token of its own, renewed by the
holder at every tick, released on a clean exit). When the holder dies another beat takes the
lease and sends what is due at once, within one lease period (ACTIVATE_BEAT_LEASE): the key
outlives the holder's last renewal by KEY_SHARE of a period and a standby asks every
STANDBY_SHARE of one.
ACTIVATE_BEAT_LEASE=0 turns the lease off: every beat process sends.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import redis
from celery.beat import PersistentScheduler
from django.conf import settings

from core.lease import RELEASE, RENEW_OR_TAKE, holder_name
from core.redis_connection import redis_client

log = logging.getLogger(__name__)
LEASE_KEY = "activate:beat-lease:"
# Shares of a lease period. The key lives KEY_SHARE of one after each renewal and the holder
# renews every RENEW_SHARE, so a successor's first send comes at least KEY_SHARE - RENEW_SHARE
# after the holder's last (settings keep the sweep interval below that), and at most
# KEY_SHARE + STANDBY_SHARE after the holder's death.
KEY_SHARE = 0.8
RENEW_SHARE = 0.1
STANDBY_SHARE = 0.1
STANDBY_MAX = 1.0


def lease_key() -> str:
    return f"{LEASE_KEY}{settings.ACTIVATE_INSTALLATION_ID}"


class BeatLease:
    """One holder at a time. Held until its time runs out by our own clock, counted from before
    the request that took or renewed it, so a holder cut off from Redis stops sending before
    anyone else may take the lease."""

    def __init__(
        self, client: redis.Redis, key: str, seconds: float, *, token: str | None = None
    ) -> None:
        self.client = client
        self.key = key
        self.seconds = seconds
        self.ttl = seconds * KEY_SHARE
        self.token = token or f"{holder_name()}:{uuid.uuid4().hex[:8]}"
        self.until = 0.0

    def hold(self) -> bool:
        """Take or renew the lease: whether we hold it now."""
        started = time.monotonic()
        try:
            kept = bool(
                self.client.eval(
                    RENEW_OR_TAKE, 1, self.key, self.token, max(1, int(self.ttl * 1000))
                )
            )
        except redis.RedisError as exc:
            log.warning("beat lease %s not renewed: %s", self.key, exc)
            return self.held()
        self.until = started + self.ttl if kept else 0.0
        return kept

    def held(self) -> bool:
        return time.monotonic() < self.until

    def holder(self) -> str | None:
        value = self.client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    def release(self) -> bool:
        """Give the lease up if it is ours (compare-and-delete): whether it was."""
        self.until = 0.0
        try:
            return bool(self.client.eval(RELEASE, 1, self.key, self.token))
        except redis.RedisError:
            return False  # it lapses on its own


class LeasedScheduler(PersistentScheduler):
    """celery.beat's persistent scheduler, sending only while it holds the beat lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        seconds = float(settings.ACTIVATE_BEAT_LEASE)
        self.lease = BeatLease(redis_client(), lease_key(), seconds) if seconds else None
        # None until the first tick says which it is.
        self.holding: bool | None = None
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self.lease is None:
            return float(super().tick(*args, **kwargs))
        lease = self.lease
        holding = lease.hold()
        if holding != self.holding:
            self.holding = holding
            if holding:
                log.info("beat lease %s taken by %s: sending the schedule", lease.key, lease.token)
            else:
                log.info("beat lease %s not ours: standing by", lease.key)
        if not holding:
            return min(STANDBY_MAX, STANDBY_SHARE * lease.seconds)
        return min(float(super().tick(*args, **kwargs)), RENEW_SHARE * lease.seconds)

    def close(self) -> None:
        if self.lease is not None and self.holding:
            self.holding = False
            if self.lease.release():
                log.info("beat lease %s released", self.lease.key)
        super().close()

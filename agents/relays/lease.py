"""The relay lease: one holder per cluster and installation, in Redis, whatever the number of
`run_relays` processes."""

from __future__ import annotations

import logging
import time
import uuid

import redis
from django.conf import settings

from core.lease import RELEASE, RENEW_OR_TAKE, holder_name
from core.redis_connection import redis_client

log = logging.getLogger(__name__)
LEASE_KEY = "activate:relay-lease:"


class Lease:
    """One holder per cluster and installation. Held until its time runs out by our own clock,
    so a holder that cannot reach Redis lets go before anyone else may take it."""

    def __init__(self, cluster_id: int) -> None:
        self.key = f"{LEASE_KEY}{settings.ACTIVATE_INSTALLATION_ID}:{cluster_id}"
        self.token = f"{holder_name()}:{uuid.uuid4().hex}"
        self.until = 0.0

    def _ttl_ms(self) -> int:
        return max(1, int(settings.ACTIVATE_RELAY_LEASE * 1000))

    def take(self) -> bool:
        started = time.monotonic()
        try:
            taken = bool(redis_client().set(self.key, self.token, nx=True, px=self._ttl_ms()))
        except redis.RedisError as exc:
            log.warning("relay lease %s: %s", self.key, exc)
            return False
        if taken:
            self.until = started + settings.ACTIVATE_RELAY_LEASE
        return taken

    def renew(self) -> bool:
        """Whether we still hold it."""
        started = time.monotonic()
        try:
            kept = bool(redis_client().eval(RENEW_OR_TAKE, 1, self.key, self.token, self._ttl_ms()))
        except redis.RedisError as exc:
            log.warning("relay lease %s not renewed: %s", self.key, exc)
            return self.held()
        self.until = started + settings.ACTIVATE_RELAY_LEASE if kept else 0.0
        return kept

    def held(self) -> bool:
        return time.monotonic() < self.until

    def release(self) -> None:
        self.until = 0.0
        try:
            redis_client().eval(RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            pass  # it lapses on its own

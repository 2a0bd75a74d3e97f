"""The relay lease: one holder per cluster and installation, in Redis, whatever the number of
`run_relays` processes.

Fenced (core/lease.py): each taking draws a new fence, and every renewal is a compare on it, so
a keeper paused past its lease and continued finds its fence gone at its next check and ends
without touching the relay or its row; its release cannot delete its successor's lease.
"""

from __future__ import annotations

import logging
import time
import uuid

import redis
from django.conf import settings

from core import lease as leases
from core.lease import holder_name
from core.redis_connection import redis_client

log = logging.getLogger(__name__)
LEASE_KEY = "activate:relay-lease:"


class Lease:
    """One holder per cluster and installation. Held until its time runs out by our own clock,
    so a holder that cannot reach Redis lets go before anyone else may take it."""

    def __init__(self, cluster_id: int) -> None:
        self.key = f"{LEASE_KEY}{settings.ACTIVATE_INSTALLATION_ID}:{cluster_id}"
        self.token = f"{holder_name()}:{uuid.uuid4().hex}"
        # The counter's number for our holding (0: none).
        self.number = 0
        self.until = 0.0

    @property
    def fence(self) -> str:
        return leases.fence_of(self.token, self.number)

    def _ttl_ms(self) -> int:
        return max(1, int(settings.ACTIVATE_RELAY_LEASE * 1000))

    def take(self) -> bool:
        """Take the lease if nobody holds it: a new holding, with a new fence."""
        self.number = 0
        self.until = 0.0
        return self.renew()

    def renew(self) -> bool:
        """Whether we still hold it (or took it again, lapsed, with nobody else meanwhile)."""
        started = time.monotonic()
        try:
            number = leases.renew_or_take(
                redis_client(), self.key, self.token, self._ttl_ms(), self.number
            )
        except redis.RedisError as exc:
            log.warning("relay lease %s not renewed: %s", self.key, exc)
            return self.held()
        self.number = number
        self.until = started + settings.ACTIVATE_RELAY_LEASE if number else 0.0
        return bool(number)

    def held(self) -> bool:
        return time.monotonic() < self.until

    def release(self) -> None:
        self.until = 0.0
        try:
            leases.release(redis_client(), self.key, self.fence)
        except redis.RedisError:
            pass  # it lapses on its own

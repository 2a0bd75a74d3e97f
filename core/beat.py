"""Celery beat on every host, one sending at a time: a lease in Redis.

Each beat process keeps its schedule as usual but sends due tasks only while it holds the lease
(``activate:beat-lease:<installation>``, its value the holder's name and fence, core/lease.py),
renewed by the holder at every tick and released on a clean exit. When the holder dies another
beat takes the lease and sends what is due at once, within one lease period
(ACTIVATE_BEAT_LEASE): the key outlives the holder's last renewal by KEY_SHARE of a period and
a standby asks every STANDBY_SHARE of one.
ACTIVATE_BEAT_LEASE=0 turns the lease off: every beat process sends.

Fencing (core/lease.py): every task the holder sends carries its holding's fence in a message
header (FENCE_HEADER), and every task checks it at its entry (``FencedTask``, the platform app's
task class, so a scheduled task of any app is fenced without saying so; ``refuses``, one Redis
script):
a task sent by a holder that was paused between its last renewal and the send, and continued
after another beat took the lease, finds another fence in the lease and does nothing, logged
and counted in ``<lease key>:refused``. The check is at the task's entry, not at each write:
every sweep's writes are compare-and-set already (drills/two_beats.py), so what the fence
prevents is a whole second sweep beside the new holder's, not a torn one. Tasks sent without
the header (the lease off, by hand, a batch's continuation) act as before.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextvars import ContextVar
from typing import Any

import redis
from celery import Task
from celery.beat import PersistentScheduler, ScheduleEntry
from celery.signals import before_task_publish
from django.conf import settings

from core import lease as leases
from core.lease import holder_name
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
# The message header carrying the sender's fence, and the fence of the send under way.
FENCE_HEADER = "activate_beat_fence"
_sending: ContextVar[str] = ContextVar("beat_fence_sending", default="")


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
        # The counter's number for our holding (0: none).
        self.number = 0
        self.until = 0.0

    @property
    def fence(self) -> str:
        return leases.fence_of(self.token, self.number)

    def hold(self) -> bool:
        """Take or renew the lease: whether we hold it now."""
        started = time.monotonic()
        try:
            number = leases.renew_or_take(
                self.client, self.key, self.token, max(1, int(self.ttl * 1000)), self.number
            )
        except redis.RedisError as exc:
            log.warning("beat lease %s not renewed: %s", self.key, exc)
            return self.held()
        self.number = number
        self.until = started + self.ttl if number else 0.0
        return bool(number)

    def held(self) -> bool:
        return time.monotonic() < self.until

    def holder(self) -> str | None:
        value = self.client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    def release(self) -> bool:
        """Give the lease up if it is ours (compare-and-delete): whether it was."""
        self.until = 0.0
        try:
            return leases.release(self.client, self.key, self.fence)
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

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        if self.lease is None:
            return super().apply_async(entry, producer, advance, **kwargs)
        sending = _sending.set(self.lease.fence)
        try:
            return super().apply_async(entry, producer, advance, **kwargs)
        finally:
            _sending.reset(sending)

    def close(self) -> None:
        if self.lease is not None and self.holding:
            self.holding = False
            if self.lease.release():
                log.info("beat lease %s released", self.lease.key)
        super().close()


@before_task_publish.connect(weak=False, dispatch_uid="beat-fence")
def _carry_fence(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    fence = _sending.get()
    if fence and headers is not None:
        headers[FENCE_HEADER] = fence


class FencedTask(Task):
    """The platform's task class: a task that a leased beat sent runs only while the fence it
    carries is the lease's (None, having done nothing, when it is not)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if refuses(self):
            return None
        return super().__call__(*args, **kwargs)


def refuses(task: Task) -> bool:
    """Whether a task sent by beat must do nothing: the fence it carries is not the beat
    lease's now (its sender lost the lease before the task landed). Unverifiable (Redis not
    answering) counts as stale: the next holder's send comes within a sweep interval."""
    # A worker's request has the message's headers as attributes; an applied one, in a dict.
    request = task.request
    fence = getattr(request, FENCE_HEADER, None) or (request.headers or {}).get(FENCE_HEADER)
    if not fence:
        return False
    try:
        if leases.fence_holds(redis_client(), lease_key(), str(fence)):
            return False
    except redis.RedisError as exc:
        log.warning(
            "%s sent under beat fence %s not run: the fence unchecked: %s", task.name, fence, exc
        )
        return True
    log.warning(
        "%s sent under beat fence %s refused: the beat lease is not its any more", task.name, fence
    )
    return True

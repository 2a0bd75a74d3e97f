"""Beat sweeps: each step handles one item and says whether there was work.

Every step ends in a lifecycle compare-and-set, so two beat processes sweeping at once
cannot record a transition twice.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from workers_app import lifecycle
from workers_app.heartbeats import HeartbeatStore
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
log = logging.getLogger(__name__)
BATCH = 500
TIMED_STATUSES = (S.PENDING, S.QUEUED, S.STARTING)


def time_out_one(now: datetime) -> bool:
    """Fail the most overdue worker, if any. Returns whether one was found."""
    for status in TIMED_STATUSES:
        worker = Worker.objects.overdue(status, now).first()
        if worker is not None:
            lifecycle.time_out(worker, now=now)
            return True
    return False


def sweep_timeouts(*, limit: int = BATCH) -> int:
    handled = 0
    while handled < limit and time_out_one(timezone.now()):
        handled += 1
    return handled


def sweep_heartbeats(*, store: HeartbeatStore | None = None) -> int:
    """Stop connected workers whose heartbeat key expired; returns how many were stopped."""
    store = store or HeartbeatStore()
    if not store.intact():
        if store.claim_reset():
            ids = list(Worker.objects.filter(status=S.CONNECTED).values_list("pk", flat=True))
            store.beat_many(ids)
            log.warning(
                "heartbeat store was reset; %d connected workers get a grace period", len(ids)
            )
        return 0
    stopped = 0
    last_pk = 0
    while True:
        batch = list(
            Worker.objects.filter(status=S.CONNECTED, pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", flat=True)[:BATCH]
        )
        if not batch:
            return stopped
        last_pk = batch[-1]
        missing = set(batch) - store.alive(batch)
        # A reset between the epoch check and the key read must not look like silence.
        if missing and not store.intact():
            return stopped
        for worker in Worker.objects.filter(pk__in=missing):
            stopped += lifecycle.mark_disconnected(worker)


def dispatch_pending(*, limit: int = BATCH) -> list[int]:
    """Pending workers whose submission is due (first try, retry, or a lost task)."""
    now = timezone.now()
    ids = list(
        Worker.objects.awaiting_dispatch(now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    # A lease, so the next sweep does not send the same worker again while its task waits.
    Worker.objects.filter(pk__in=ids, status=S.PENDING).update(
        next_attempt_at=now + timedelta(seconds=settings.ACTIVATE_SUBMIT_LEASE)
    )
    return ids

"""Beat sweeps: each step handles one item and says whether there was work.

Every step ends in a lifecycle compare-and-set, so two beat processes sweeping at once
cannot record a transition twice.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from core.locks import submissions_under_way
from workers_app import idle, relays
from workers_app.actions import lifecycle
from workers_app.liveness import Breakers, Liveness, ShedRecord, SweepRecord
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
log = logging.getLogger(__name__)
BATCH = 500
# Sweeps this many intervals apart mean the platform itself had a gap (sweeper, Redis or DB).
SWEEP_GAP_FACTOR = 3
TIMED_STATUSES = (S.PENDING, S.QUEUED, S.STARTING)
GONE_BACK = "heartbeat store went back to an older copy during a sweep"


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


def platform_hears() -> bool:
    """Whether agents can reach the platform now: the sweep asks their own endpoint, through
    the URL their job scripts use, which answers only when it can reach Redis too."""
    if not settings.ACTIVATE_HEARING_PROBE:
        return True
    try:
        answer = httpx.get(
            settings.ACTIVATE_AGENT_URL.rstrip("/") + reverse("agent-ping"),
            timeout=min(5.0, settings.ACTIVATE_SWEEP_INTERVAL),
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def _grant_grace(store: Liveness, why: str) -> None:
    ids = list(Worker.objects.filter(status=S.CONNECTED).values_list("pk", flat=True))
    store.beat_many(ids)
    log.warning("%s: %d connected workers get a fresh grace period", why, len(ids))


def sweep_heartbeats(
    *,
    store: Liveness | None = None,
    record: SweepRecord | None = None,
    breakers: Breakers | None = None,
    now: float | None = None,
) -> int:
    """Stop connected workers whose heartbeat key expired; returns how many were stopped.

    Silence counts only while the platform could demonstrably hear: after any gap on its own
    side (Redis lost its data, the sweeps did not run, the agents' endpoint did not answer),
    every connected worker gets a fresh grace period instead; while the agents' server shed
    beats lately (a heartbeat timeout), nobody's silence counts. The sweep's own time is written
    last, so a sweep that fails (database or Redis down) leaves a gap the next one sees.
    """
    store = store or Liveness()
    record = record or SweepRecord(store.redis)
    breakers = breakers or Breakers(store.redis)
    now = time.time() if now is None else now
    if not store.intact():
        if store.claim_reset():
            _grant_grace(store, "heartbeat store was reset")
        record.note_sweep(now)
        return 0
    previous = record.last_sweep()
    if (
        previous is not None
        and now - previous > SWEEP_GAP_FACTOR * settings.ACTIVATE_SWEEP_INTERVAL
    ):
        _grant_grace(store, f"heartbeat sweeps stopped for {now - previous:.0f}s")
        record.note_sweep(now)
        return 0
    if not platform_hears():
        record.mark_deaf()
        log.warning("agents cannot reach the platform: no worker is declared lost meanwhile")
        record.note_sweep(now)
        return 0
    if record.clear_deaf():
        _grant_grace(store, "agents could not reach the platform")
        record.note_sweep(now)
        return 0
    silent = _silent_connected(store)
    if silent is None:
        return 0
    if silent and _went_back(record, previous):
        # Redis was replaced by an older copy of itself while this sweep read it (a restored
        # snapshot, a stale replica promoted): its expired keys are not silence.
        _grant_grace(store, GONE_BACK)
        record.note_sweep(now)
        return 0
    if silent and ShedRecord(store.redis).shed_lately():
        # As for a relay that shed calls: a beat the platform refused is not the agent's silence.
        log.warning(
            "the agents' server shed beats within a heartbeat timeout: %d silent workers are "
            "not lost",
            len(silent),
        )
        record.note_sweep(now)
        return 0
    stopped = 0
    unreachable = relays.clusters_agents_cannot_reach(timezone.now()) if silent else set()
    for cluster_id, workers in _by_cluster(silent).items():
        if cluster_id in unreachable:
            # Agents via the login host were cut off by their relay (down, or shedding calls),
            # not silent on their own.
            log.warning(
                "cluster %s: its relay was down or shed calls lately; nobody is lost", cluster_id
            )
            continue
        if _breaker_holds(breakers, cluster_id, len(workers), now):
            continue
        for worker in workers:
            stopped += lifecycle.mark_disconnected(worker)
        breakers.close(cluster_id)
    record.note_sweep(now)
    return stopped


def _went_back(record: SweepRecord, previous: float | None) -> bool:
    """Whether the store's last sweep time is now older than at this sweep's start (another
    sweeper's later write is not going back)."""
    again = record.last_sweep()
    return previous is not None and (again is None or again < previous)


def _silent_connected(store: Liveness) -> list[Worker] | None:
    """Connected workers whose key expired; None if Redis was reset while they were read."""
    silent: list[int] = []
    last_pk = 0
    while True:
        batch = list(
            Worker.objects.filter(status=S.CONNECTED, pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", flat=True)[:BATCH]
        )
        if not batch:
            break
        last_pk = batch[-1]
        silent += sorted(set(batch) - store.alive(batch))
    # A reset between the epoch check and the key reads must not look like silence.
    if silent and not store.intact():
        return None
    return list(Worker.objects.filter(pk__in=silent))


def _by_cluster(workers: list[Worker]) -> dict[int, list[Worker]]:
    groups: dict[int, list[Worker]] = {}
    for worker in workers:
        groups.setdefault(worker.cluster_id, []).append(worker)
    return groups


def _breaker_holds(breakers: Breakers, cluster_id: int, silent: int, now: float) -> bool:
    """Too many of a cluster's workers silent at once: keep them until an operator confirms."""
    connected = Worker.objects.filter(cluster_id=cluster_id, status=S.CONNECTED).count()
    too_many = (
        connected >= settings.ACTIVATE_BREAKER_MIN_WORKERS
        and silent > settings.ACTIVATE_BREAKER_SHARE * connected
    )
    if not too_many or breakers.is_confirmed(cluster_id):
        return False
    breakers.open(cluster_id, silent=silent, connected=connected, at=now)
    log.error(
        "cluster %s: %d of %d connected workers went silent at once; keeping them until an "
        "operator confirms (admin: Clusters, 'Confirm lost workers')",
        cluster_id,
        silent,
        connected,
    )
    return True


def dispatch_pending(*, limit: int = BATCH) -> list[int]:
    """Pending workers whose submission is due (first try, retry, or a lost task).

    Those whose submission lock stands are left out, not leased: the holder is at work, or cut
    off until its peer silence frees the lock, and then the next sweep sends them.
    """
    now = timezone.now()
    ids = list(
        Worker.objects.awaiting_dispatch(now)
        .exclude(pk__in=submissions_under_way())
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    # A lease, so the next sweep does not send the same worker again while its task waits.
    lifecycle.lease_pending(ids, until=now + timedelta(seconds=settings.ACTIVATE_SUBMIT_LEASE))
    return ids


def sweep_idle_workers(now: datetime | None = None) -> dict[str, int]:
    """The idle policy's step (``idle.apply_policy``) for every connected worker that has one;
    how many it warned, deleted and took the warning back of."""
    now = now or timezone.now()
    done = {idle.Decision.WARN: 0, idle.Decision.END: 0, idle.Decision.CLEAR: 0}
    workers = list(
        Worker.objects.filter(status=S.CONNECTED, idle_minutes__gt=0).select_related(
            "owner", "cluster"
        )
    )
    idleness = idle.idleness_of(workers, now)
    for worker in workers:
        state = idleness.get(worker.pk)
        did = None if state is None else idle.apply_policy(worker, state, now)
        if did is not None:
            done[did] += 1
    return done

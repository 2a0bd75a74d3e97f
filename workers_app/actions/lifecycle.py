"""The worker lifecycle: one function per status change, and nothing else writes a status.

Each change is a compare-and-set on the status that was read, plus an event row, in one
transaction; side effects (cancelling a job, ending sessions) run after commit. Two callers
racing for the same change cannot both win: the loser's update matches no row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import metrics as families
from core.bulk import insert_all
from core.statemachine import StateMachine
from workers_app import effects, signals
from workers_app.liveness import Liveness
from workers_app.models import Worker, WorkerEvent
from workers_app.statuses import FINISHED, TRANSITIONS, WorkerStatus

S = WorkerStatus
log = logging.getLogger(__name__)

REASON_PENDING_TIMEOUT = "Timed out waiting for worker to connect"
REASON_QUEUED_TIMEOUT = "Timed out waiting in the scheduler queue"
REASON_DISCONNECTED = "Worker disconnected"
REASON_DELETED = "Deleted by user"
REASON_CANCELED = "Canceled"
REASON_CANCELED_BEFORE_SUBMIT = "Canceled before it was sent to the cluster"


def _deadline(status: WorkerStatus, now: datetime) -> datetime | None:
    timeout = {
        S.PENDING: settings.ACTIVATE_PENDING_TIMEOUT,
        S.QUEUED: settings.ACTIVATE_QUEUED_TIMEOUT,
        # A running job whose agent never calls back gets the same allowance as a pending one.
        S.STARTING: settings.ACTIVATE_PENDING_TIMEOUT,
    }.get(status)
    return None if timeout is None else now + timedelta(seconds=timeout)


def initial_deadline(now: datetime) -> datetime | None:
    return _deadline(S.PENDING, now)


def initial_timing(now: datetime) -> dict[str, datetime | None]:
    """The timing columns of a worker requested at ``now``: the deadline of its pending status,
    and a lease that keeps the dispatch sweep off it while the submission queued with it runs."""
    return {
        "created_at": now,
        "deadline_at": initial_deadline(now),
        "next_attempt_at": now + timedelta(seconds=settings.ACTIVATE_SUBMIT_LEASE),
    }


_MACHINE = StateMachine(Worker, WorkerEvent, TRANSITIONS, FINISHED, finished_field="finished_at")


def _change(
    worker: Worker,
    new: WorkerStatus,
    *,
    allowed_from: Iterable[WorkerStatus],
    reason: str,
    fields: dict[str, Any] | None = None,
    match: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Move ``worker`` to ``new`` if its stored status is one of ``allowed_from``.

    Returns whether this call made the change. ``worker`` is refreshed with the written values.
    """
    now = now or timezone.now()
    return _MACHINE.change(
        worker,
        new,
        allowed_from=allowed_from,
        reason=reason,
        now=now,
        fields={"deadline_at": _deadline(new, now), **(fields or {})},
        match=match,
        after=lambda changed, old: _after_change(changed, S(old), new),
    )


def _after_change(worker: Worker, old: WorkerStatus, new: WorkerStatus) -> None:
    worker_id = worker.pk
    if worker.cancel_requested:
        effects.cancel_worker_job(worker_id)
    if new == S.CONNECTED:
        signals.worker_connected.send(sender=Worker, worker=worker)
    if new in FINISHED:
        failed = worker.status_reason == REASON_DISCONNECTED or new == S.ERROR
        signals.worker_finished.send(sender=Worker, worker=worker, failed=failed)
    if new in FINISHED or old == S.CONNECTED:
        # The agent's cached identity goes too, so its next beat asks the database and is sent away.
        public_id = worker.public_id
        transaction.on_commit(lambda: Liveness().forget(worker_id, public_id))


def record_event(worker: Worker, reason: str) -> None:
    """A note in the worker's history that is not a status change (e.g. an adopted job)."""
    WorkerEvent.objects.create(
        worker_id=worker.pk, old_status=worker.status, new_status=worker.status, reason=reason
    )


def record_events(workers: list[Worker], reason: str) -> None:
    """``record_event`` for many workers, in one insert."""
    insert_all(
        [
            WorkerEvent(worker_id=w.pk, old_status=w.status, new_status=w.status, reason=reason)
            for w in workers
        ]
    )


# One function per change. Each returns whether it made the change.


def mark_submitted(worker: Worker, *, job_id: str, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return _change(
        worker,
        S.QUEUED,
        allowed_from=[S.PENDING],
        reason="",
        fields={"scheduler_job_id": job_id, **_submitted_fields(now)},
        now=now,
    )


def _submitted_fields(now: datetime) -> dict[str, Any]:
    return {"submitted_at": now, "next_attempt_at": None}


def mark_submitted_many(
    submitted: list[tuple[Worker, str]], *, now: datetime | None = None
) -> list[Worker]:
    """``mark_submitted`` for many workers (each with its job id) at once; those it changed."""
    now = now or timezone.now()
    return _MACHINE.change_many(
        [worker for worker, _ in submitted],
        S.QUEUED,
        old=S.PENDING,
        reason="",
        fields={"deadline_at": _deadline(S.QUEUED, now), **_submitted_fields(now)},
        each={worker.pk: {"scheduler_job_id": job_id} for worker, job_id in submitted},
        now=now,
        after=lambda changed, old: _after_change(changed, S(old), S.QUEUED),
    )


def mark_started(worker: Worker, *, hostname: str, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return _change(
        worker,
        S.STARTING,
        allowed_from=[S.PENDING, S.QUEUED],
        reason="",
        fields={"node_hostname": hostname, "started_at": now},
        now=now,
    )


def mark_requeued(worker: Worker, *, reason: str) -> bool:
    return _change(
        worker,
        S.QUEUED,
        allowed_from=[S.STARTING, S.CONNECTED],
        reason=reason,
        fields={"node_hostname": "", "connected_at": None},
    )


def mark_connected(
    worker: Worker, *, hostname: str, job_id: str = "", now: datetime | None = None
) -> bool:
    now = now or timezone.now()
    fields: dict[str, Any] = {"node_hostname": hostname, "connected_at": now}
    if not worker.started_at:
        fields["started_at"] = now
    if job_id and not worker.scheduler_job_id:
        fields["scheduler_job_id"] = job_id
    changed = _change(
        worker, S.CONNECTED, allowed_from=[S.QUEUED, S.STARTING], reason="", fields=fields, now=now
    )
    if changed:
        waited = (now - worker.created_at).total_seconds()
        cluster = worker.cluster.name
        transaction.on_commit(lambda: families.REQUEST_TO_CONNECTED.labels(cluster).observe(waited))
    return changed


def request_stop(worker: Worker, *, reason: str = REASON_DELETED) -> bool:
    """Deletion: a worker with no job ends at once; one with a job waits in ``stopping``."""
    if worker.status == S.PENDING and not worker.scheduler_job_id:
        return _change(
            worker,
            S.STOPPED,
            allowed_from=[S.PENDING],
            reason=REASON_CANCELED_BEFORE_SUBMIT,
            fields={"next_attempt_at": None},
        ) or request_stop_with_job(worker, reason=reason)
    return request_stop_with_job(worker, reason=reason)


def request_stop_with_job(worker: Worker, *, reason: str) -> bool:
    return _change(
        worker,
        S.STOPPING,
        allowed_from=[S.QUEUED, S.STARTING, S.CONNECTED],
        reason=reason,
        fields={"cancel_requested": True},
    )


def mark_job_ended(
    worker: Worker, *, state: str, exit_code: str, failed: bool, reason: str = ""
) -> bool:
    """The scheduler says the job is over: show its final state."""
    reason = reason or describe_job_end(state, exit_code)
    fields = {"scheduler_state": state, "exit_code": exit_code, "cancel_requested": False}
    if worker.status == S.STOPPING:
        # A stop the platform asked for keeps its own reason ("Deleted after 30 minutes idle").
        asked = worker.status_reason
        final = REASON_CANCELED if asked in ("", REASON_DELETED) else asked
        return _change(worker, S.STOPPED, allowed_from=[S.STOPPING], reason=final, fields=fields)
    return _change(
        worker,
        S.ERROR if failed else S.STOPPED,
        allowed_from=[S.PENDING, S.QUEUED, S.STARTING, S.CONNECTED, S.STOPPING],
        reason=reason,
        fields=fields,
    )


def describe_job_end(state: str, exit_code: str) -> str:
    if not state:
        return "Job ended; its final state is no longer known to the scheduler"
    return f"Job {state} with exit code {exit_code or 'unknown'}"


def mark_disconnected(worker: Worker) -> bool:
    return _change(
        worker,
        S.STOPPED,
        allowed_from=[S.CONNECTED],
        reason=REASON_DISCONNECTED,
        fields={"cancel_requested": bool(worker.scheduler_job_id)},
    )


def fail_worker(
    worker: Worker,
    *,
    reason: str,
    from_statuses: Iterable[WorkerStatus] = (S.PENDING, S.QUEUED, S.STARTING, S.CONNECTED),
) -> bool:
    """Any failure that ends a live worker; its job, if any, is cancelled."""
    return _change(
        worker,
        S.ERROR,
        allowed_from=from_statuses,
        reason=reason,
        fields={"cancel_requested": bool(worker.scheduler_job_id), "next_attempt_at": None},
    )


def time_out(worker: Worker, *, now: datetime | None = None) -> bool:
    """The sweep's step: fail a worker whose current status outlived its deadline."""
    now = now or timezone.now()
    current = Worker.objects.filter(pk=worker.pk).values_list("status", "deadline_at").first()
    if current is None or current[1] is None or current[1] > now:
        return False
    status = S(current[0])
    reason = {
        S.PENDING: REASON_PENDING_TIMEOUT,
        S.STARTING: REASON_PENDING_TIMEOUT,
        S.QUEUED: REASON_QUEUED_TIMEOUT,
    }.get(status)
    if reason is None:
        return False
    worker.refresh_from_db(fields=["scheduler_job_id"])
    return _change(
        worker,
        S.ERROR,
        allowed_from=[status],
        reason=reason,
        fields={"cancel_requested": bool(worker.scheduler_job_id), "next_attempt_at": None},
        match={"deadline_at__lte": now},
        now=now,
    )


def note_waiting(worker: Worker, *, reason: str, next_attempt_at: datetime) -> bool:
    """A pending worker stays pending (e.g. its cluster is unreachable): say why, retry later."""
    updated = Worker.objects.filter(pk=worker.pk, status=S.PENDING).update(
        status_reason=reason[:512],
        next_attempt_at=next_attempt_at,
        submit_attempts=worker.submit_attempts + 1,
        updated_at=timezone.now(),
    )
    worker.status_reason, worker.next_attempt_at = reason[:512], next_attempt_at
    worker.submit_attempts += 1
    return updated == 1


def lease_submission(worker: Worker, *, until: datetime) -> None:
    """A submission owns this pending worker until ``until``; the dispatch sweep waits."""
    lease_pending([worker.pk], until=until)
    worker.next_attempt_at = until


def lease_submissions(workers: list[Worker], *, until: datetime) -> None:
    """``lease_submission`` for many pending workers in one update."""
    lease_pending([w.pk for w in workers], until=until)
    for worker in workers:
        worker.next_attempt_at = until


def lease_pending(worker_ids: list[int], *, until: datetime) -> None:
    """``lease_submission`` by id, for the dispatch sweep that sends them."""
    Worker.objects.filter(pk__in=worker_ids, status=S.PENDING).update(next_attempt_at=until)


def attempt_pending_now(cluster_id: int, *, now: datetime) -> int:
    """What waited for a cluster (to answer again, or for its relay) is sent now rather than at
    the end of its backoff. Returns how many pending workers were made due."""
    return Worker.objects.filter(cluster_id=cluster_id, status=S.PENDING).update(
        next_attempt_at=now
    )

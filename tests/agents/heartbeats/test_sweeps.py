"""Sweeps: exact deadlines, lost heartbeats, Redis resets, purged lists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.locks import submission_lock
from core.redis_connection import redis_client
from tests.broker import queued_messages
from tests.factories import WorkerFactory
from workers_app import effects, sweeps, tasks
from workers_app.actions import lifecycle
from workers_app.liveness import Liveness
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus


def connected_worker() -> Worker:
    worker = WorkerFactory()
    lifecycle.mark_submitted(worker, job_id="5")
    Liveness().beat(worker.pk)
    lifecycle.mark_connected(worker, hostname="n1")
    return worker


@pytest.mark.django_db
def test_a_pending_worker_times_out_exactly_at_its_deadline() -> None:
    worker = WorkerFactory()
    deadline = worker.deadline_at
    assert not sweeps.time_out_one(deadline - timedelta(milliseconds=1))
    assert sweeps.time_out_one(deadline)
    worker.refresh_from_db()
    assert (worker.status, worker.status_reason) == (S.ERROR, lifecycle.REASON_PENDING_TIMEOUT)
    assert not sweeps.time_out_one(deadline + timedelta(days=1))


@pytest.mark.django_db
def test_a_queued_worker_times_out_and_its_job_is_marked_to_be_cancelled(
    settings: object,
) -> None:
    # The cancel itself, on the real Slurm: tests/e2e/test_timeouts.py.
    worker = WorkerFactory()
    lifecycle.mark_submitted(worker, job_id="88")
    worker.refresh_from_db()
    assert worker.deadline_at == worker.submitted_at + timedelta(
        seconds=settings.ACTIVATE_QUEUED_TIMEOUT  # type: ignore[attr-defined]
    )
    assert sweeps.time_out_one(worker.deadline_at)
    worker.refresh_from_db()
    assert (worker.status, worker.status_reason) == (S.ERROR, lifecycle.REASON_QUEUED_TIMEOUT)
    assert worker.cancel_requested and worker.scheduler_job_id == "88"


@pytest.mark.django_db
def test_a_connected_worker_without_heartbeat_is_stopped_and_its_sessions_fail() -> None:
    from sessions_app.models import Session

    Liveness().claim_reset()
    alive, silent = connected_worker(), connected_worker()
    session = Session.objects.create(
        name="desk", owner=silent.owner, session_type="desktop", worker=silent
    )
    Liveness().forget(silent.pk)
    assert sweeps.sweep_heartbeats() == 1
    silent.refresh_from_db()
    alive.refresh_from_db()
    assert (silent.status, silent.status_reason) == (S.STOPPED, "Worker disconnected")
    assert silent.cancel_requested
    assert alive.status == S.CONNECTED
    session.refresh_from_db()
    assert (session.status, session.status_reason) == ("failed", "Worker disconnected")


@pytest.mark.django_db
def test_when_redis_loses_its_data_then_no_connected_worker_is_stopped() -> None:
    workers = [connected_worker() for _ in range(3)]
    store = Liveness()
    assert store.claim_reset()
    redis_client().flushdb()  # its own database: other runs share the server
    assert sweeps.sweep_heartbeats() == 0
    assert sweeps.sweep_heartbeats() == 0
    assert all(Worker.objects.get(pk=w.pk).status == S.CONNECTED for w in workers)
    assert store.alive([w.pk for w in workers]) == {w.pk for w in workers}


@pytest.mark.django_db
def test_finished_workers_leave_lists_after_the_purge_delay(settings: object) -> None:
    settings.ACTIVATE_PURGE_AFTER = 60  # type: ignore[attr-defined]
    old, recent, live = WorkerFactory(), WorkerFactory(), WorkerFactory()
    lifecycle.request_stop(old)
    lifecycle.request_stop(recent)
    Worker.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(seconds=61))
    listed = set(Worker.objects.visible_to(old.owner).values_list("pk", flat=True))
    assert old.pk not in listed
    staff_listed = set(Worker.objects.visible(timezone.now()).values_list("pk", flat=True))
    assert staff_listed == {recent.pk, live.pk}
    assert Worker.objects.filter(pk=old.pk).exists()


@pytest.mark.django_db
def test_dispatch_sends_due_pending_workers_once_per_lease() -> None:
    worker = WorkerFactory(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert sweeps.dispatch_pending() == [worker.pk]
    assert sweeps.dispatch_pending() == []


@pytest.mark.django_db
def test_dispatch_leaves_a_worker_whose_submission_lock_stands_for_the_next_sweep() -> None:
    # Given a due worker whose submission lock is held (a holder at work, or cut off)
    worker = WorkerFactory(next_attempt_at=timezone.now() - timedelta(seconds=1))
    with submission_lock(worker.pk) as taken:
        assert taken
        # Then the sweep neither sends nor leases it
        assert sweeps.dispatch_pending() == []
        assert Worker.objects.awaiting_dispatch(timezone.now()).filter(pk=worker.pk).exists()
    # And the first sweep after the lock is given up sends it
    assert sweeps.dispatch_pending() == [worker.pk]


def due_pending_workers(count: int) -> list[Worker]:
    return [
        WorkerFactory(next_attempt_at=timezone.now() - timedelta(seconds=1)) for _ in range(count)
    ]


@pytest.mark.django_db
def test_dispatch_goes_on_while_batches_come_back_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given more due workers than a batch holds
    monkeypatch.setattr(sweeps, "BATCH", 2)
    workers = due_pending_workers(5)

    # When the beat's dispatch task runs once
    sent = tasks.dispatch_pending.apply().get()

    # Then every worker went out, each once, a message a batch, and the task did not re-queue
    messages = queued_messages()
    assert sent == 5
    assert [name for name, _ in messages] == [effects.SUBMIT_MANY] * 3
    assert sorted(pk for _, (ids,) in messages for pk in ids) == sorted(w.pk for w in workers)
    assert all(len(ids) <= 2 for _, (ids,) in messages)
    assert not Worker.objects.awaiting_dispatch(timezone.now()).exists()


@pytest.mark.django_db
def test_a_dispatch_that_runs_out_of_time_queues_itself_to_go_on(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # Given more due workers than a batch holds, and no time to send a second batch
    monkeypatch.setattr(sweeps, "BATCH", 2)
    settings.ACTIVATE_SWEEP_INTERVAL = 0
    due_pending_workers(5)

    # When the dispatch task runs
    sent = tasks.dispatch_pending.apply().get()

    # Then one batch went, and a fresh dispatch task is queued for the rest
    assert sent == 2
    assert [name for name, _ in queued_messages()] == [
        effects.SUBMIT_MANY,
        "workers_app.tasks.dispatch_pending",
    ]
    assert Worker.objects.awaiting_dispatch(timezone.now()).count() == 3


@pytest.mark.django_db
def test_the_timeout_sweep_goes_on_while_batches_come_back_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sweeps, "BATCH", 2)
    overdue = [WorkerFactory(deadline_at=timezone.now() - timedelta(seconds=1)) for _ in range(5)]

    assert tasks.sweep_timeouts.apply().get() == 5

    assert all(Worker.objects.get(pk=w.pk).status == S.ERROR for w in overdue)
    assert "workers_app.tasks.sweep_timeouts" not in [name for name, _ in queued_messages()]

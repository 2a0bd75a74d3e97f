"""The lifecycle: legal transitions only, one event per change, one winner per race."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import WorkerFactory
from workers_app.actions import jobs, lifecycle
from workers_app.models import Worker
from workers_app.statuses import FINISHED, TRANSITIONS, WorkerStatus, can_transition

S = WorkerStatus
L = TypeVar("L")
R = TypeVar("R")

OPERATIONS: dict[str, Callable[[Worker], bool]] = {
    "submit": lambda w: lifecycle.mark_submitted(w, job_id="42"),
    "start": lambda w: lifecycle.mark_started(w, hostname="node1"),
    "requeue": lambda w: lifecycle.mark_requeued(w, reason="Job REQUEUED"),
    "connect": lambda w: lifecycle.mark_connected(w, hostname="node1"),
    "stop": lambda w: lifecycle.request_stop(w),
    "job_ended_ok": lambda w: lifecycle.mark_job_ended(
        w, state="COMPLETED", exit_code="0:0", failed=False
    ),
    "job_failed": lambda w: lifecycle.mark_job_ended(
        w, state="FAILED", exit_code="1:0", failed=True
    ),
    "disconnect": lambda w: lifecycle.mark_disconnected(w),
    "fail": lambda w: lifecycle.fail_worker(w, reason="broken"),
    "cancel_confirmed": lambda w: (jobs.confirm_job_gone(w), True)[1],
    "time_out": lambda w: lifecycle.time_out(w, now=timezone.now() + timedelta(days=30)),
}


def assert_history_is_consistent(worker: Worker) -> None:
    worker.refresh_from_db()
    changes = [e for e in worker.events.order_by("at", "id") if e.old_status != e.new_status]
    previous = S.PENDING
    for event in changes:
        assert event.old_status == previous, f"event chain broken at {event}"
        assert can_transition(event.old_status, event.new_status), f"illegal {event}"
        previous = S(event.new_status)
    assert worker.status == previous
    assert (worker.finished_at is not None) == (worker.status in FINISHED)
    if worker.status in (S.QUEUED, S.PENDING, S.STARTING):
        assert worker.deadline_at is not None


def test_given_the_table_then_finished_statuses_are_terminal_and_all_are_reachable() -> None:
    assert all(not TRANSITIONS[status] for status in FINISHED)
    reachable = {S.PENDING}
    frontier = [S.PENDING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(WorkerStatus)


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.sampled_from(sorted(OPERATIONS)), max_size=12))
def test_given_any_sequence_of_calls_then_the_worker_only_takes_legal_steps(
    operations: list[str],
) -> None:
    worker = WorkerFactory()
    for name in operations:
        before = Worker.objects.get(pk=worker.pk).status
        events_before = worker.events.count()
        changed = OPERATIONS[name](worker)
        after = Worker.objects.get(pk=worker.pk).status
        if name != "cancel_confirmed":
            assert changed == (before != after) or (changed and before == after is None)
        if before != after:
            assert can_transition(before, after)
            assert worker.events.count() == events_before + 1
        assert_history_is_consistent(worker)


@pytest.mark.django_db
def test_when_a_finished_worker_is_asked_to_change_then_nothing_happens() -> None:
    worker = WorkerFactory()
    assert lifecycle.request_stop(worker)
    assert worker.status == S.STOPPED
    for operation in OPERATIONS.values():
        operation(worker)
    worker.refresh_from_db()
    assert worker.status == S.STOPPED
    assert worker.status_reason == lifecycle.REASON_CANCELED_BEFORE_SUBMIT


@pytest.mark.django_db
def test_when_a_queued_worker_is_deleted_then_it_waits_in_stopping_until_the_job_is_gone() -> None:
    worker = WorkerFactory()
    lifecycle.mark_submitted(worker, job_id="77")
    assert lifecycle.request_stop(worker)
    worker.refresh_from_db()
    assert (worker.status, worker.cancel_requested) == (S.STOPPING, True)
    jobs.confirm_job_gone(worker)
    worker.refresh_from_db()
    assert (worker.status, worker.cancel_requested) == (S.STOPPED, False)
    assert worker.scheduler_job_id == "77"


@pytest.mark.django_db
def test_when_the_job_times_out_then_the_reason_shows_the_scheduler_state() -> None:
    worker = WorkerFactory()
    lifecycle.mark_submitted(worker, job_id="9")
    lifecycle.mark_connected(worker, hostname="n1")
    lifecycle.mark_job_ended(worker, state="TIMEOUT", exit_code="0:0", failed=False)
    worker.refresh_from_db()
    assert worker.status == S.STOPPED
    assert worker.status_reason == "Job TIMEOUT with exit code 0:0"


@pytest.mark.django_db
def test_given_a_deadline_not_yet_reached_then_time_out_does_nothing() -> None:
    worker = WorkerFactory()
    assert worker.deadline_at is not None
    assert not lifecycle.time_out(worker, now=worker.deadline_at - timedelta(seconds=1))
    assert lifecycle.time_out(worker, now=worker.deadline_at)
    worker.refresh_from_db()
    assert (worker.status, worker.status_reason) == (S.ERROR, lifecycle.REASON_PENDING_TIMEOUT)


def _at_once(load: Callable[[], L], calls: list[Callable[[L], R]]) -> list[R | None]:
    """Each call in a thread of its own, on what ``load`` read there, all let go together."""
    barrier = threading.Barrier(len(calls))
    results: list[R | None] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            loaded = load()
            barrier.wait()
            results[index] = calls[index](loaded)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _race(worker_pk: int, calls: list[Callable[[Worker], bool]]) -> list[bool]:
    return [bool(won) for won in _at_once(lambda: Worker.objects.get(pk=worker_pk), calls)]


@pytest.mark.django_db(transaction=True)
def test_when_two_callers_race_for_the_same_transition_then_exactly_one_wins() -> None:
    assert connection.vendor == "postgresql"
    for _ in range(15):
        worker = WorkerFactory()
        lifecycle.mark_submitted(worker, job_id="1")
        connect = OPERATIONS["connect"]
        results = _race(worker.pk, [connect, connect, connect, connect])
        assert sum(results) == 1
        assert worker.events.filter(new_status=S.CONNECTED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_when_stop_and_timeout_race_then_one_final_status_is_recorded_once() -> None:
    for _ in range(15):
        worker = WorkerFactory()
        results = _race(
            worker.pk,
            [
                lambda w: lifecycle.fail_worker(w, reason="timed out"),
                lambda w: lifecycle.request_stop(w),
                lambda w: lifecycle.fail_worker(w, reason="timed out"),
            ],
        )
        assert sum(results) == 1
        finished = worker.events.filter(new_status__in=FINISHED)
        assert finished.count() == 1
        assert_history_is_consistent(worker)


@pytest.mark.django_db
def test_many_submitted_at_once_get_each_its_job_and_one_event_and_an_ended_one_is_left() -> None:
    # Given five pending workers, one of them stopped meanwhile
    workers = [WorkerFactory() for _ in range(5)]
    lifecycle.request_stop(workers[2])
    stopped = Worker.objects.get(pk=workers[2].pk).status
    workers[2].status = S.PENDING  # what the submitting process last read
    # When they are marked submitted together, each with its own job
    changed = lifecycle.mark_submitted_many([(w, f"70{n}") for n, w in enumerate(workers)])
    # Then the four still pending are queued with their own job, deadline and one event; the
    # stopped one is untouched and its object says what it is now
    assert [w.pk for w in changed] == [w.pk for n, w in enumerate(workers) if n != 2]
    for n, worker in enumerate(workers):
        stored = Worker.objects.get(pk=worker.pk)
        assert stored.status == worker.status
        if n == 2:
            assert (stored.status, stored.scheduler_job_id) == (stopped, "")
            continue
        assert (stored.status, stored.scheduler_job_id) == (S.QUEUED, f"70{n}")
        assert stored.deadline_at is not None and stored.submitted_at is not None
        assert stored.next_attempt_at is None
        assert stored.events.filter(old_status=S.PENDING, new_status=S.QUEUED).count() == 1
        assert_history_is_consistent(worker)


def _two_batches(pks: list[int]) -> dict[str, list[int]]:
    """Two processes mark the same workers submitted at once, each with jobs of its own tag;
    which workers each changed."""

    def batch(tag: str) -> Callable[[list[Worker]], list[int]]:
        return lambda mine: [
            w.pk for w in lifecycle.mark_submitted_many([(w, f"{tag}{w.pk}") for w in mine])
        ]

    first, second = _at_once(
        lambda: list(Worker.objects.filter(pk__in=pks).order_by("pk")), [batch("1"), batch("2")]
    )
    return {"1": first or [], "2": second or []}


@pytest.mark.django_db(transaction=True)
def test_two_batches_racing_for_the_same_workers_queue_each_once_with_the_winners_job() -> None:
    assert connection.vendor == "postgresql"
    for _ in range(10):
        pks = [WorkerFactory().pk for _ in range(6)]
        won = _two_batches(pks)
        assert sorted(won["1"] + won["2"]) == sorted(pks)
        for worker in Worker.objects.filter(pk__in=pks):
            winner = "1" if worker.pk in won["1"] else "2"
            assert worker.scheduler_job_id == f"{winner}{worker.pk}"
            assert worker.events.filter(new_status=S.QUEUED).count() == 1

"""Many rows in one statement (core.bulk), against the real PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.bulk import insert_all, update_each
from tests.factories import WorkerFactory
from workers_app.models import Worker, WorkerEvent

pytestmark = pytest.mark.django_db


def unsaved(template: Worker, n: int, **changes: object) -> Worker:
    worker = Worker(
        owner=template.owner,
        cluster=template.cluster,
        environment=template.environment,
        name=f"bulk-{n}",
        params={"walltime": "01:00:00", "nested": [1, {"a": None}]},
        job_directives=["--qos=low"],
        created_at=template.created_at,
    )
    for name, value in changes.items():
        setattr(worker, name, value)
    return worker


def test_inserted_workers_get_their_own_pks_and_every_column_as_bulk_create_would() -> None:
    assert connection.vendor == "postgresql"
    template = WorkerFactory()
    # Given workers that share most columns and differ in a few (one with a null where the
    # others have a time, one with other params)
    workers = [unsaved(template, n) for n in range(6)]
    workers[3].next_attempt_at = timezone.now()
    workers[4].params = {"walltime": "02:00:00"}
    expected = [unsaved(template, n) for n in range(6)]
    expected[3].next_attempt_at = workers[3].next_attempt_at
    expected[4].params = workers[4].params
    for worker, twin in zip(workers, expected, strict=True):
        twin.public_id = worker.public_id
    # When they are inserted in one statement
    insert_all(workers, key="public_id")
    # Then each object has the pk of its own row, and each row holds what the object said
    compared = [
        f.attname for f in Worker._meta.concrete_fields if f.name not in ("id", "updated_at")
    ]
    for worker, twin in zip(workers, expected, strict=True):
        assert not worker._state.adding and worker.pk is not None
        stored = Worker.objects.get(pk=worker.pk)
        assert stored.public_id == worker.public_id
        for name in compared:
            assert getattr(stored, name) == getattr(twin, name), name


def test_events_pair_in_order_and_a_duplicate_inserts_nothing() -> None:
    worker = WorkerFactory()
    events = [WorkerEvent(worker=worker, new_status="pending", reason=f"r{n}") for n in range(5)]
    insert_all(events)
    assert [e.reason for e in WorkerEvent.objects.filter(pk__in=[e.pk for e in events])] == [
        f"r{n}" for n in range(5)
    ]
    assert sorted(e.pk for e in events) == [e.pk for e in events]
    # A public id already taken: the whole statement is refused, as Django's own error
    template = WorkerFactory()
    clash = [unsaved(template, 1), unsaved(template, 2, public_id=template.public_id)]
    before = Worker.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_all(clash, key="public_id")
    assert Worker.objects.count() == before


def test_update_each_writes_each_rows_own_values_only_where_the_status_still_matches() -> None:
    workers = [WorkerFactory() for _ in range(4)]
    Worker.objects.filter(pk=workers[1].pk).update(status="stopped")
    written = update_each(
        Worker,
        {w.pk: {"scheduler_job_id": f"j{n}"} for n, w in enumerate(workers)},
        common={"node_hostname": "n1"},
        status="pending",
    )
    assert written == {workers[0].pk, workers[2].pk, workers[3].pk}
    stored = {w.pk: (w.scheduler_job_id, w.node_hostname) for w in Worker.objects.all()}
    assert stored[workers[1].pk] == ("", "")
    assert stored[workers[3].pk] == ("j3", "n1")

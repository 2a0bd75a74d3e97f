"""The platform's own shedding as the heartbeat sweep reads it (workers_app.liveness.ShedRecord):
beats the agents' server shed are noted for a heartbeat timeout, and no silence counts
meanwhile, as for a relay that shed calls. The server's side: test_overload_shed.py."""

from __future__ import annotations

import pytest

from tests.factories import WorkerFactory
from workers_app import sweeps
from workers_app.actions import lifecycle
from workers_app.liveness import Liveness, ShedRecord
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db


def silent_connected() -> Worker:
    worker = WorkerFactory()
    lifecycle.mark_submitted(worker, job_id="5")
    Liveness().beat(worker.pk)
    lifecycle.mark_connected(worker, hostname="n1")
    Liveness().forget(worker.pk)
    return worker


def test_notes_add_up_in_a_window_of_one_heartbeat_timeout_on_redis_clock(
    settings: object,
) -> None:
    record = ShedRecord()
    assert (record.shed_lately(), record.window(), record.total()) == (False, (0, None), 0)
    record.note(3)
    record.note(4)
    count, last = record.window()
    assert (record.shed_lately(), count, record.total()) == (True, 7, 7)
    assert last is not None and abs(last - record.redis.time()[0]) < 2
    timeout_ms = settings.ACTIVATE_HEARTBEAT_TIMEOUT * 1000  # type: ignore[attr-defined]
    assert timeout_ms - 2000 < record.redis.pttl(record.key) <= timeout_ms
    # The window ends; the total stays
    record.redis.delete(record.key)
    assert (record.shed_lately(), record.window(), record.total()) == (False, (0, None), 7)


def test_no_silent_worker_is_stopped_while_the_platform_shed_lately_and_is_once_it_did_not() -> (
    None
):
    Liveness().claim_reset()
    worker = silent_connected()
    ShedRecord().note(1)
    assert sweeps.sweep_heartbeats() == 0
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED
    # A heartbeat timeout after the last shed beat: silence counts again
    ShedRecord().redis.delete(ShedRecord().key)
    assert sweeps.sweep_heartbeats() == 1
    worker.refresh_from_db()
    assert worker.status == S.STOPPED


def test_each_installation_sharing_a_redis_has_its_own_record(settings: object) -> None:
    ShedRecord().note(2)
    settings.ACTIVATE_INSTALLATION_ID = "other"  # type: ignore[attr-defined]
    assert (ShedRecord().shed_lately(), ShedRecord().total()) == (False, 0)

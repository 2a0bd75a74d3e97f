"""The session sweep goes on past its batch: every ready session's start is queued each beat."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import Session
from sessions_app.statuses import SessionStatus
from tests.broker import queued_messages
from tests.factories import WorkerFactory
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)


def pending_session(worker_status: WorkerStatus, owner: Any) -> Session:
    worker = WorkerFactory(owner=owner, status=worker_status, scheduler_job_id="41")
    session = Session(name="desktop_1", owner=owner, session_type="desktop", worker=worker)
    session.set_secret("s3cret")
    session.save()
    return session


def test_the_sweep_queues_every_ready_start_across_batches(user: Any) -> None:
    # Given more ready sessions than a batch, and one whose worker is not connected yet
    ready = [pending_session(WorkerStatus.CONNECTED, user) for _ in range(5)]
    waiting = pending_session(WorkerStatus.QUEUED, user)

    # When the sweep runs with batches of two
    count = services.sweep_sessions(batch=2)

    # Then each ready session's start is queued exactly once, and the waiting one's is not
    starts = [args for name, args in queued_messages() if name == services.START_TASK]
    assert count == 5
    assert sorted(session_id for (session_id,) in starts) == sorted(s.pk for s in ready)
    assert waiting.status == SessionStatus.PENDING and [waiting.pk] not in starts

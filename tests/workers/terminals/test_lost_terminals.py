"""Terminal records whose serving process is gone (killed, its host lost) are closed with a
reason by the terminals sweep; those still served are left alone. Real Redis and PostgreSQL;
the process dying for real is drills/host_loss.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import AbstractUser
from django.utils import timezone

from core import sweep_lag
from core.redis_connection import redis_client
from tests.factories import WorkerFactory
from workers_app import tasks
from workers_app.models import TerminalRecord
from workers_app.statuses import WorkerStatus
from workers_app.terminals.service import (
    ALIVE_FOR,
    ALIVE_KEY,
    LOST_REASON,
    close_lost_terminals,
    note_alive,
)

pytestmark = pytest.mark.django_db(transaction=True)


def opened(user: AbstractUser, seconds_ago: float, **extra: object) -> TerminalRecord:
    worker = WorkerFactory(owner=user, status=WorkerStatus.CONNECTED)
    return TerminalRecord.objects.create(
        worker=worker,
        worker_public_id=worker.public_id,
        user=user,
        opened_at=timezone.now() - timedelta(seconds=seconds_ago),
        **extra,
    )


def is_open(record: TerminalRecord) -> bool:
    record.refresh_from_db()
    return record.closed_at is None


def test_a_record_nobody_serves_is_closed_on_the_second_sweep_that_misses_it(
    user: AbstractUser,
) -> None:
    lost = opened(user, 3 * ALIVE_FOR)
    served = opened(user, 3 * ALIVE_FOR)
    fresh = opened(user, 0)
    done = opened(user, 3 * ALIVE_FOR, closed_at=timezone.now(), close_reason="exited with 0")
    note_alive(served.pk)
    assert close_lost_terminals() == 0
    assert is_open(lost)
    note_alive(served.pk)
    assert close_lost_terminals() == 1
    assert not is_open(lost)
    lost.refresh_from_db()
    assert lost.close_reason == LOST_REASON and lost.exit_status is None
    assert is_open(served) and is_open(fresh)
    done.refresh_from_db()
    assert done.close_reason == "exited with 0"


def test_a_key_lost_with_redis_is_written_again_before_the_second_sweep(
    user: AbstractUser,
) -> None:
    served = opened(user, 3 * ALIVE_FOR)
    note_alive(served.pk)
    # Redis restarted empty: the key is gone until the serving process's next refresh.
    redis_client().delete(f"{ALIVE_KEY}{served.pk}")
    assert close_lost_terminals() == 0
    note_alive(served.pk)
    assert close_lost_terminals() == 0
    assert close_lost_terminals() == 0
    assert is_open(served)


def test_the_key_lives_alive_for_seconds() -> None:
    note_alive(991)
    ttl = redis_client().pttl(f"{ALIVE_KEY}991")
    assert ALIVE_FOR * 1000 - 2000 < ttl <= ALIVE_FOR * 1000


def test_the_sweep_task_notes_its_completion(user: AbstractUser) -> None:
    lost = opened(user, 3 * ALIVE_FOR)
    tasks.sweep_terminals()
    assert tasks.sweep_terminals() == 1
    assert not is_open(lost)
    assert sweep_lag.sweep_lag()["terminals"] is not None

"""A Redis flushed under a live platform (a restart without persistence): its own module, so
its own platform (tests/platforms.py): the flush takes Celery's queue bindings too."""

from __future__ import annotations

import time

import pytest

from core.redis_connection import redis_client
from harness.platform import Platform
from tests.e2e.test_worker_life import (
    HEARTBEAT_TIMEOUT,
    SWEEP_INTERVAL,
    request,
    status_of,
    wait_status,
)
from workers_app.actions import deletion
from workers_app.models import Environment
from workers_app.statuses import WorkerStatus as S

pytestmark = [pytest.mark.slurm, pytest.mark.live]


def test_flushing_redis_stops_no_connected_worker(
    platform: Platform,
    environment: Environment,
    user,
) -> None:
    workers = [request(environment, user) for _ in range(2)]
    for worker in workers:
        wait_status(worker, {S.CONNECTED}, 120, platform)
    for _ in range(3):
        redis_client().flushdb()  # its own database: other runs share the server
        time.sleep(HEARTBEAT_TIMEOUT / 2)
    time.sleep(HEARTBEAT_TIMEOUT + 2 * SWEEP_INTERVAL)
    assert [status_of(w) for w in workers] == [S.CONNECTED, S.CONNECTED]
    for worker in workers:
        deletion.delete_worker(worker)
    for worker in workers:
        wait_status(worker, {S.STOPPED}, 60, platform)

"""Time limits are exact to the sweep, measured with real processes at short timeouts."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import FAST_KNOBS, Platform
from harness.waiting import wait_for
from tests.e2e.conftest import on_every_scheduler
from workers_app.actions import lifecycle
from workers_app.models import ApiKey, Cluster, Environment, EnvironmentField, Worker

pytestmark = [pytest.mark.slurm, pytest.mark.live]
PENDING, QUEUED = 4.0, 6.0
SWEEP = float(FAST_KNOBS["ACTIVATE_SWEEP_INTERVAL"])
# Scheduling jitter of beat and the worker process on a busy two-core machine.
SLACK = 1.5


@pytest.fixture
def short_timeouts(transactional_db: None, tmp_path: Path):
    knobs = {"ACTIVATE_PENDING_TIMEOUT": str(PENDING), "ACTIVATE_QUEUED_TIMEOUT": str(QUEUED)}
    with Platform(workdir=tmp_path, knobs=knobs).running() as platform:
        yield platform


def create(platform: Platform, user: User, environment: Environment, **params: str) -> Worker:
    _, key = ApiKey.issue(user)
    response = httpx.post(
        f"{platform.url}/api/workers/",
        json={
            "cluster": environment.cluster.name,
            "environment": environment.name,
            "params": params,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return Worker.objects.get(public_id=response.json()["id"])


def finished(worker: Worker) -> bool:
    worker.refresh_from_db()
    return worker.is_finished


@on_every_scheduler
def test_a_worker_pending_on_an_unreachable_cluster_fails_at_its_limit_not_before(
    short_timeouts: Platform, environment: Environment, user: User
) -> None:
    Cluster.objects.filter(pk=environment.cluster_id).update(port=2299)
    worker = create(short_timeouts, user, environment)
    wait_for(lambda: finished(worker), timeout=PENDING + 10)
    assert (worker.status, worker.status_reason) == ("error", lifecycle.REASON_PENDING_TIMEOUT)
    assert worker.finished_at is not None
    waited = (worker.finished_at - worker.created_at).total_seconds()
    assert PENDING <= waited <= PENDING + SWEEP + SLACK


@on_every_scheduler
def test_a_worker_queued_too_long_fails_at_its_limit_and_its_job_is_cancelled(
    short_timeouts: Platform,
    environment: Environment,
    cell: Cell,
    user: User,
    ssh_target: SshTarget,
) -> None:
    EnvironmentField.objects.create(
        environment=environment, name="directives", kind="directives", position=5
    )
    worker = create(short_timeouts, user, environment, directives=cell.hold_directive)
    wait_for(lambda: finished(worker), timeout=QUEUED + 20)
    assert (worker.status, worker.status_reason) == ("error", lifecycle.REASON_QUEUED_TIMEOUT)
    assert worker.submitted_at is not None and worker.finished_at is not None
    waited = (worker.finished_at - worker.submitted_at).total_seconds()
    assert QUEUED <= waited <= QUEUED + SWEEP + SLACK
    wait_for(lambda: worker.job_name not in cell.job_names(ssh_target.user), timeout=30)
    wait_for(lambda: not Worker.objects.get(pk=worker.pk).cancel_requested, timeout=30)

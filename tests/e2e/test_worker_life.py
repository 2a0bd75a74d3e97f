"""End to end: real web server, Celery worker and beat, each real scheduler over real SSH, real
Redis."""

from __future__ import annotations

import time

import pytest

from core.redis_connection import redis_client
from harness.agents import freeze_agent
from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import FAST_KNOBS, Platform
from harness.waiting import wait_for
from tests.e2e.conftest import on_every_scheduler
from workers_app.actions import deletion, requests
from workers_app.models import Environment, EnvironmentField, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]

HEARTBEAT_TIMEOUT = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_TIMEOUT"])
SWEEP_INTERVAL = float(FAST_KNOBS["ACTIVATE_SWEEP_INTERVAL"])
SWEEP_START = 0.25


def status_of(worker: Worker) -> str:
    worker.refresh_from_db()
    return worker.status


def request(environment: Environment, user, **params: str) -> Worker:
    return requests.request_worker(
        owner=user,
        cluster=environment.cluster.name,
        environment=environment.name,
        params=params,
    )


def wait_status(worker: Worker, wanted: set[str], timeout: float, platform: Platform) -> str:
    try:
        return str(wait_for(lambda: status_of(worker) in wanted and worker.status, timeout=timeout))
    except TimeoutError:
        pytest.fail(f"worker stayed {worker.status} ({worker.status_reason})\n{platform.logs()}")


@on_every_scheduler
def test_a_worker_connects_and_a_silent_node_is_stopped_within_the_heartbeat_timeout(
    platform: Platform,
    environment: Environment,
    cell: Cell,
    user,
    ssh_target: SshTarget,
) -> None:
    worker = request(environment, user)
    seen = {wait_status(worker, {S.QUEUED, S.STARTING, S.CONNECTED}, 60, platform)}
    wait_status(worker, {S.CONNECTED}, 90, platform)
    assert worker.node_hostname and worker.scheduler_job_id
    assert worker.events.filter(new_status=S.QUEUED).exists() or S.QUEUED in seen
    assert worker.job_name in cell.job_names(ssh_target.user)

    # The sweeps have met this store already (its first sweep grants everyone a grace period).
    wait_for(lambda: redis_client().exists("activate:hb-epoch"), timeout=30)
    assert freeze_agent(worker.public_id)
    # When its last beat's key expires (a beat on its way at the freeze included).
    time.sleep(0.5)
    left = redis_client().pttl(f"activate:hb:{worker.pk}")
    assert left > 0, "the frozen agent's key expired already"
    expires_at = time.time() + left / 1000
    wait_status(worker, {S.STOPPED, S.ERROR}, HEARTBEAT_TIMEOUT + 20, platform)
    assert (worker.status, worker.status_reason) == (S.STOPPED, "Worker disconnected")
    # Timed by the stop's own event: never before its heartbeat key expired (the timeout after
    # its last beat), and within one sweep after (the README's promise), give or take the sweep
    # task's start (beat publishes it, a Celery process takes it: a CI run saw 17 ms).
    stopped = worker.events.get(new_status=S.STOPPED).at.timestamp()
    late = stopped - expires_at
    assert -0.05 <= late <= SWEEP_INTERVAL + SWEEP_START, late
    wait_for(lambda: worker.job_name not in cell.job_names(ssh_target.user), timeout=30)


@on_every_scheduler
def test_a_job_that_reaches_its_wall_time_shows_timeout(
    platform: Platform,
    environment: Environment,
    cell: Cell,
    user,
    ssh_target: SshTarget,
) -> None:
    worker = request(environment, user, walltime=cell.shortest_walltime)
    wait_status(worker, {S.CONNECTED}, 90, platform)
    wait_status(worker, {S.STOPPED, S.ERROR}, 200, platform)
    assert worker.status == S.STOPPED
    assert worker.status_reason.startswith("Job TIMEOUT with exit code ")
    assert worker.scheduler_state == "TIMEOUT"


@on_every_scheduler
def test_deleting_a_worker_pending_queued_or_connected_leaves_no_job(
    platform: Platform,
    environment: Environment,
    cell: Cell,
    user,
    ssh_target: SshTarget,
) -> None:
    # (Deletion in every status, starting and stopping included: the `deletion` drill.)
    EnvironmentField.objects.create(
        environment=environment, name="directives", kind="directives", position=5
    )
    connected = request(environment, user)
    held = request(environment, user, directives=cell.hold_directive)
    wait_status(connected, {S.CONNECTED}, 90, platform)
    wait_status(held, {S.QUEUED}, 90, platform)
    assert held.job_name in cell.job_names(ssh_target.user)
    just_requested = request(environment, user)
    assert just_requested.status == S.PENDING
    workers = (connected, held, just_requested)
    for worker in workers:
        deletion.delete_worker(worker)
    for worker in workers:
        wait_status(worker, {S.STOPPED}, 60, platform)
    names = {worker.job_name for worker in workers}
    wait_for(lambda: not names & set(cell.job_names(ssh_target.user)), timeout=60)

"""Commands run through the platform are bounded: output size (with a mark), run time, and how
many one user runs at once. On a real connected worker's node over real SSH."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from core.transport.errors import CommandTimeout
from tests.workers.jobs.test_submit_poll_cancel import poll_until
from workers_app.actions import commands, jobs, lifecycle
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


@pytest.fixture
def running_worker(new_worker) -> Worker:
    worker: Worker = new_worker()
    jobs.submit_worker(worker.pk)
    poll_until(worker, {S.STARTING})
    lifecycle.mark_connected(worker, hostname=worker.node_hostname)
    return worker


def test_endless_output_is_cut_at_the_limit_with_a_mark_and_the_call_returns(
    running_worker: Worker, settings
) -> None:
    settings.ACTIVATE_EXEC_MAX_OUTPUT = 100_000
    started = time.monotonic()

    result = commands.run_on_worker(running_worker, ["yes"], user=running_worker.owner)

    assert time.monotonic() - started < 10
    assert result.truncated and result.exit_status == -1
    assert len(result.stdout) == 100_000 and set(result.stdout) == {"y", "\n"}
    assert "output cut at 100000 bytes" in result.stderr
    [record] = running_worker.commands.all()
    assert record.exit_status is None and "cut" in record.error


def test_a_command_that_outlives_the_limit_is_ended_as_a_timeout(
    running_worker: Worker, settings
) -> None:
    settings.ACTIVATE_EXEC_TIMEOUT = 2

    with pytest.raises(CommandTimeout):
        commands.run_on_worker(running_worker, ["sleep", "30"], user=running_worker.owner)

    [record] = running_worker.commands.all()
    assert "did not finish in time" in record.error


@pytest.mark.django_db(transaction=True)
def test_one_user_runs_at_most_the_allowed_commands_at_once(
    running_worker: Worker, settings
) -> None:
    settings.ACTIVATE_EXEC_PER_USER = 1
    owner = running_worker.owner

    def long_command() -> None:
        try:
            commands.run_on_worker(running_worker, ["sleep", "3"], user=owner)
        finally:
            connection.close()

    first = threading.Thread(target=long_command)
    first.start()
    time.sleep(1)
    try:
        with pytest.raises(commands.TooManyCommands):
            commands.run_on_worker(running_worker, ["true"], user=owner)
    finally:
        first.join()
    assert commands.run_on_worker(running_worker, ["true"], user=owner).exit_status == 0

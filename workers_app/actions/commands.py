"""Commands users run on a worker's node (pw ssh, the API's exec), under a per-user slot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from core.errors import ParameterError
from core.redis_connection import redis_client
from core.transport.errors import SSHError
from schedulers.base import CommandResult, QueryFailed, SchedulerError
from workers_app.cluster_access import adapter_for_worker
from workers_app.models import Worker, WorkerCommand
from workers_app.statuses import WorkerStatus


class WorkerNotReady(Exception):
    """Commands run only on a worker whose node is known and whose agent is connected."""


class TooManyCommands(Exception):
    """The user already runs ACTIVATE_EXEC_PER_USER commands through the platform."""


TRUNCATION_MARK = "\n[output cut at {limit} bytes by the platform; the command was left]\n"


@contextmanager
def _command_slot(user: User) -> Iterator[None]:
    """At most ACTIVATE_EXEC_PER_USER commands of one user at once, across processes."""
    key = f"activate:exec-running:{user.pk}"
    client = redis_client()
    running = client.incr(key)
    # A process killed mid-command must not hold its slot for ever.
    client.expire(key, int(settings.ACTIVATE_EXEC_TIMEOUT) + 60)
    try:
        if running > settings.ACTIVATE_EXEC_PER_USER:
            raise TooManyCommands(
                f"you already run {settings.ACTIVATE_EXEC_PER_USER} commands through the "
                "platform; wait for one to end"
            )
        yield
    finally:
        client.decr(key)


def run_on_worker(worker: Worker, argv: list[str], *, user: User) -> CommandResult:
    """Run one command on the worker's node, inside its job, as the job's own account.

    The node is the one the scheduler reports for the job, never the agent's claim. Every
    command is recorded (who, worker, command, when, exit status) for operators.
    """
    if worker.status != WorkerStatus.CONNECTED or not worker.scheduler_job_id:
        raise WorkerNotReady(f"worker {worker.public_id} is {worker.status}, not connected")
    if not argv or any("\x00" in arg for arg in argv):
        raise ParameterError("command", "must be a non-empty list of arguments without NULs")
    with _command_slot(user):
        record = WorkerCommand.objects.create(worker=worker, user=user, command=argv)
        return _run_recorded(worker, argv, record)


def _run_recorded(worker: Worker, argv: list[str], record: WorkerCommand) -> CommandResult:
    adapter = adapter_for_worker(worker)
    limit = settings.ACTIVATE_EXEC_MAX_OUTPUT
    try:
        result = adapter.run_in_job(
            worker.scheduler_job_id,
            argv,
            timeout=settings.ACTIVATE_EXEC_TIMEOUT,
            output_limit=limit,
        )
    except (SSHError, QueryFailed, SchedulerError, ValueError) as exc:
        WorkerCommand.objects.filter(pk=record.pk).update(
            finished_at=timezone.now(), error=str(exc)[:512]
        )
        raise
    WorkerCommand.objects.filter(pk=record.pk).update(
        finished_at=timezone.now(),
        exit_status=None if result.truncated else result.exit_status,
        error="output cut at the limit" if result.truncated else "",
    )
    if result.truncated:
        return replace(result, stderr=result.stderr + TRUNCATION_MARK.format(limit=limit))
    return result

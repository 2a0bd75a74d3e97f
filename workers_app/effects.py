"""Side effects of state changes, queued by task name once the change commits.

The lifecycle and the services call these; the tasks module imports the services, never the
reverse. A name is looked up in the Celery app, so eager mode (ACTIVATE_TASKS_EAGER) still runs
tasks in-process. A broker that cannot take a message loses nothing: the sweeps find the work.
"""

from __future__ import annotations

import logging

from django.db import transaction
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from activate.celery import app

log = logging.getLogger(__name__)

SUBMIT = "workers_app.tasks.submit_worker"
SUBMIT_MANY = "workers_app.tasks.submit_workers"
CANCEL = "workers_app.tasks.cancel_worker_job"


def _enqueue(task: str, args: tuple[object, ...]) -> None:
    try:
        app.signature(task, args=args).apply_async()
    except (OperationalError, RedisError, OSError) as exc:
        # The change is committed; answering an error now would make a client retry it. The
        # sweeps find what was not queued: pending workers are dispatched again, and every
        # poll re-queues the cancel of a job that is still there.
        log.warning("could not queue %s%r (the sweeps will): %s", task, args, exc)


def _enqueue_on_commit(task: str, *args: object) -> None:
    transaction.on_commit(lambda: _enqueue(task, args))


def submit_worker(worker_id: int) -> None:
    _enqueue_on_commit(SUBMIT, worker_id)


def submit_workers(worker_ids: list[int]) -> None:
    """One message for many workers: they are submitted together, grouped by account."""
    if len(worker_ids) == 1:
        submit_worker(worker_ids[0])
    elif worker_ids:
        _enqueue_on_commit(SUBMIT_MANY, list(worker_ids))


def cancel_worker_job(worker_id: int) -> None:
    _enqueue_on_commit(CANCEL, worker_id)

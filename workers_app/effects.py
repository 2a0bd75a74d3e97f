"""Side effects of state changes, queued by task name once the change commits.

The lifecycle and the services call these; the tasks module imports the services, never the
reverse. A name is looked up in the Celery app, so eager mode (ACTIVATE_TASKS_EAGER) still runs
tasks in-process.
"""

from __future__ import annotations

from django.db import transaction

from activate.celery import app

SUBMIT = "workers_app.tasks.submit_worker"
CANCEL = "workers_app.tasks.cancel_worker_job"


def _enqueue_on_commit(task: str, *args: object) -> None:
    transaction.on_commit(lambda: app.signature(task, args=args).apply_async())


def submit_worker(worker_id: int) -> None:
    _enqueue_on_commit(SUBMIT, worker_id)


def cancel_worker_job(worker_id: int) -> None:
    _enqueue_on_commit(CANCEL, worker_id)

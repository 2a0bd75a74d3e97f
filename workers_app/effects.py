"""Side effects of workers' state changes, queued by task name once the change commits.

The lifecycle and the services call these; the tasks module imports the services, never the
reverse. A broker that cannot take a message loses nothing: the sweeps find the work.
"""

from __future__ import annotations

from core.statemachine import enqueue_on_commit

SUBMIT = "workers_app.tasks.submit_worker"
SUBMIT_MANY = "workers_app.tasks.submit_workers"
CANCEL = "workers_app.tasks.cancel_worker_job"
PROBE = "workers_app.tasks.probe_cluster"


def submit_worker(worker_id: int) -> None:
    enqueue_on_commit(SUBMIT, worker_id)


def submit_workers(worker_ids: list[int]) -> None:
    """One message for many workers: they are submitted together, grouped by account."""
    if len(worker_ids) == 1:
        submit_worker(worker_ids[0])
    elif worker_ids:
        enqueue_on_commit(SUBMIT_MANY, list(worker_ids))


def cancel_worker_job(worker_id: int) -> None:
    enqueue_on_commit(CANCEL, worker_id)


def probe_cluster(cluster_id: int) -> None:
    enqueue_on_commit(PROBE, cluster_id)

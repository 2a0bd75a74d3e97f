"""Celery tasks: thin wrappers over the actions in ``jobs`` and ``clusters``, and ``sweeps``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from celery.signals import task_postrun
from django.conf import settings

from core import sweep_lag
from workers_app import cluster_access as connections
from workers_app import sweeps
from workers_app.actions import clusters, jobs
from workers_app.models import Cluster, Worker
from workers_app.terminals import service as terminals


def _fan_out(task: Task, cluster_ids: list[int], *, expires: float) -> int:
    """One task per cluster; a copy still queued when the next round starts is dropped."""
    for cluster_id in cluster_ids:
        task.apply_async((cluster_id,), expires=expires)
    return len(cluster_ids)


@task_postrun.connect
def _close_idle_connections(**kwargs: Any) -> None:
    # A worker process that goes quiet must not hold users' SSH sessions open indefinitely.
    connections.close_idle_connections()


@shared_task
def submit_worker(worker_id: int) -> str:
    return jobs.submit_worker(worker_id)


@shared_task
def submit_workers(worker_ids: list[int]) -> dict[str, str]:
    return {str(pk): outcome for pk, outcome in jobs.submit_workers(worker_ids).items()}


@shared_task
def cancel_worker_job(worker_id: int) -> str:
    # One attempt; the poll makes the next ones, with backoff, while the job is still listed.
    return jobs.cancel_worker_job(worker_id)


@shared_task
def poll_cluster(cluster_id: int) -> int:
    return jobs.poll_cluster(cluster_id)


@shared_task
def poll_clusters() -> int:
    ids = list(
        Worker.objects.to_poll()
        .order_by("cluster_id")
        .values_list("cluster_id", flat=True)
        .distinct()
    )
    return _fan_out(poll_cluster, ids, expires=settings.ACTIVATE_POLL_INTERVAL)


def _in_batches(task: Task, batch: Callable[[int], int]) -> int:
    """Run ``batch`` (it handles at most the number it is given, and says how many) while it
    comes back full: a full batch means more may be due, which should not wait for the next
    beat. After a sweep interval a fresh ``task`` goes on, so no sweep holds a process long."""
    until = time.monotonic() + settings.ACTIVATE_SWEEP_INTERVAL
    handled = 0
    while True:
        count = batch(sweeps.BATCH)
        handled += count
        if count < sweeps.BATCH:
            return handled
        if time.monotonic() >= until:
            task.delay()
            return handled


@shared_task
def sweep_timeouts() -> int:
    handled = _in_batches(sweep_timeouts, lambda limit: sweeps.sweep_timeouts(limit=limit))
    sweep_lag.note_completed("timeouts")
    return handled


@shared_task
def sweep_idle() -> dict[str, int]:
    done = sweeps.sweep_idle_workers()
    sweep_lag.note_completed("idle")
    return done


@shared_task
def sweep_terminals() -> int:
    closed = terminals.close_lost_terminals()
    sweep_lag.note_completed("terminals")
    return closed


@shared_task
def sweep_heartbeats() -> int:
    stopped = sweeps.sweep_heartbeats()
    sweep_lag.note_completed("heartbeats")
    return stopped


def _dispatch_batch(limit: int) -> int:
    ids = sweeps.dispatch_pending(limit=limit)
    if ids:
        # One message: the workers of each (cluster, account) are submitted together.
        submit_workers.delay(ids)
    return len(ids)


@shared_task
def dispatch_pending() -> int:
    return _in_batches(dispatch_pending, _dispatch_batch)


@shared_task
def probe_cluster(cluster_id: int) -> bool:
    return clusters.probe_cluster(cluster_id)


@shared_task
def probe_clusters() -> int:
    ids = list(Cluster.objects.values_list("pk", flat=True))
    return _fan_out(probe_cluster, ids, expires=settings.ACTIVATE_PROBE_INTERVAL)


@shared_task
def reconcile_cluster(cluster_id: int) -> list[str]:
    return jobs.reconcile_cluster(cluster_id)


@shared_task
def reconcile_clusters() -> int:
    ids = list(Cluster.objects.values_list("pk", flat=True))
    return _fan_out(reconcile_cluster, ids, expires=settings.ACTIVATE_RECONCILE_INTERVAL)

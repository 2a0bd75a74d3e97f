"""Celery tasks: thin wrappers over the services in ``jobs`` and ``sweeps``."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db.models import Q

from workers_app import jobs, sweeps
from workers_app.models import Cluster, Worker
from workers_app.statuses import WITH_JOB


@shared_task
def submit_worker(worker_id: int) -> str:
    return jobs.submit_worker(worker_id)


@shared_task(
    bind=True,
    autoretry_for=(jobs.CancelNotConfirmed,),
    retry_backoff=5,
    retry_backoff_max=300,
    max_retries=None,
)
def cancel_worker_job(self: object, worker_id: int) -> str:
    return jobs.cancel_worker_job(worker_id)


@shared_task
def poll_cluster(cluster_id: int) -> int:
    return jobs.poll_cluster(cluster_id)


@shared_task
def poll_clusters() -> int:
    ids = list(
        Worker.objects.filter(Q(status__in=WITH_JOB) | Q(cancel_requested=True))
        .order_by("cluster_id")
        .values_list("cluster_id", flat=True)
        .distinct()
    )
    for cluster_id in ids:
        poll_cluster.apply_async((cluster_id,), expires=settings.ACTIVATE_POLL_INTERVAL)
    return len(ids)


@shared_task
def sweep_timeouts() -> int:
    handled = sweeps.sweep_timeouts(limit=sweeps.BATCH)
    if handled == sweeps.BATCH:
        # A full batch means more may be overdue: continue now rather than at the next beat.
        sweep_timeouts.delay()
    return handled


@shared_task
def sweep_heartbeats() -> int:
    return sweeps.sweep_heartbeats()


@shared_task
def dispatch_pending() -> int:
    ids = sweeps.dispatch_pending()
    for worker_id in ids:
        submit_worker.delay(worker_id)
    return len(ids)


@shared_task
def probe_cluster(cluster_id: int) -> bool:
    return jobs.probe_cluster(cluster_id)


@shared_task
def probe_clusters() -> int:
    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        probe_cluster.apply_async((cluster_id,), expires=settings.ACTIVATE_PROBE_INTERVAL)
    return len(ids)


@shared_task
def reconcile_cluster(cluster_id: int) -> list[str]:
    return jobs.reconcile_cluster(cluster_id)


@shared_task
def reconcile_clusters() -> int:
    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        reconcile_cluster.apply_async((cluster_id,), expires=settings.ACTIVATE_RECONCILE_INTERVAL)
    return len(ids)

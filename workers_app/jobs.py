"""Services that talk to schedulers: submit, cancel, poll, probe and reconcile.

Every status change still goes through ``lifecycle``; this module only decides which one,
from what a scheduler answered. A failed or doubtful answer changes nothing.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from workers_app import lifecycle
from workers_app.agent import agent_source
from workers_app.agent_service import new_agent_secret
from workers_app.locks import submission_lock
from workers_app.models import (
    Cluster,
    Environment,
    EnvironmentField,
    EnvironmentSource,
    Reachability,
    Worker,
    job_name_prefix,
)
from workers_app.params import directives_for
from workers_app.schedulers import adapter_for
from workers_app.schedulers.base import (
    JobInfo,
    JobSpec,
    Phase,
    QueryFailed,
    SchedulerAdapter,
    SchedulerError,
)
from workers_app.schedulers.ssh import SSHError
from workers_app.statuses import WITH_JOB, WorkerStatus

S = WorkerStatus
log = logging.getLogger(__name__)

MAX_BACKOFF = 300.0

AGENT_HEREDOC = "ACTIVATE_AGENT_EOF"


def retry_delay(attempts: int) -> float:
    return float(min(MAX_BACKOFF, 5 * 2 ** min(attempts, 10)))


def note_cluster_contact(cluster: Cluster, *, error: str = "") -> None:
    now = timezone.now()
    if error:
        Cluster.objects.filter(pk=cluster.pk).update(
            reachability=Reachability.OFFLINE, last_error=error[:2000]
        )
        return
    was_offline = cluster.reachability != Reachability.ONLINE
    Cluster.objects.filter(pk=cluster.pk).update(
        reachability=Reachability.ONLINE, last_contact_at=now, last_error=""
    )
    if was_offline:
        # The cluster answers again: send what waited for it now, not at the next backoff.
        Worker.objects.filter(cluster=cluster, status=S.PENDING).update(next_attempt_at=now)


def job_script(adapter: SchedulerAdapter, worker: Worker, secret: str) -> str:
    environment = worker.environment
    directives = directives_for(environment, worker.params) if environment else []
    command = f"exec python3 - <<'{AGENT_HEREDOC}'\n{agent_source()}\n{AGENT_HEREDOC}"
    spec = JobSpec(
        name=worker.job_name,
        partition=environment.partition if environment else "",
        directives=directives,
        environment={
            "ACTIVATE_URL": settings.ACTIVATE_PUBLIC_URL,
            "ACTIVATE_WORKER_ID": worker.public_id,
            "ACTIVATE_WORKER_SECRET": secret,
            "ACTIVATE_HEARTBEAT_INTERVAL": f"{settings.ACTIVATE_HEARTBEAT_INTERVAL:g}",
        },
        command=command,
    )
    return adapter.render_script(spec)


def _may_have_a_job(worker: Worker) -> bool:
    """Whether an earlier attempt may have created this worker's job.

    Every attempt commits a fresh agent secret before it runs the submit command, so a worker
    that never had a secret never had a job, and its first attempt skips the lookup (a third of
    a submission's time). Inside a caller's transaction that commit is not durable yet.
    """
    return bool(worker.agent_secret_hash) or transaction.get_connection().in_atomic_block


def submit_worker(worker_id: int) -> str:
    """Send a pending worker's job to its cluster, exactly once. Returns what happened."""
    worker = Worker.objects.select_related("cluster", "environment").filter(pk=worker_id).first()
    if worker is None or worker.status != S.PENDING:
        return "not pending"
    with submission_lock(worker.pk) as taken:
        if not taken:
            return "another submission is in progress"
        worker.refresh_from_db()
        if worker.status != S.PENDING:
            return "not pending"
        cluster = worker.cluster
        # Should this process die mid-submit, the dispatch sweep sends it again later.
        lifecycle.lease_submission(
            worker, until=timezone.now() + timedelta(seconds=settings.ACTIVATE_SUBMIT_LEASE)
        )
        try:
            adapter = adapter_for(cluster)
            existing = adapter.find_job(worker.job_name) if _may_have_a_job(worker) else None
            if existing:
                job_id = existing
                lifecycle.record_event(worker, f"Found job {job_id} already submitted; adopted it")
            else:
                secret, secret_hash = new_agent_secret()
                Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=secret_hash)
                worker.agent_secret_hash = secret_hash
                job_id = adapter.submit(job_script(adapter, worker, secret))
        except (SSHError, QueryFailed) as exc:
            note_cluster_contact(cluster, error=str(exc))
            delay = retry_delay(worker.submit_attempts)
            lifecycle.note_waiting(
                worker,
                reason=f"Waiting for cluster {cluster.name}: {exc}",
                next_attempt_at=timezone.now() + timedelta(seconds=delay),
            )
            return f"cluster unreachable, retry in {delay:g}s"
        except SchedulerError as exc:
            note_cluster_contact(cluster)
            lifecycle.fail_worker(worker, reason=f"The scheduler refused the job: {exc}")
            return "refused"
        note_cluster_contact(cluster)
        with transaction.atomic():
            if not lifecycle.mark_submitted(worker, job_id=job_id):
                lifecycle.record_job_to_cancel(worker, job_id=job_id)
                return f"worker ended meanwhile; cancelling job {job_id}"
    return f"submitted as job {job_id}"


def cancel_worker_job(worker_id: int) -> str:
    """Ask the scheduler to end a worker's job; done only when a query no longer lists it."""
    worker = Worker.objects.select_related("cluster").filter(pk=worker_id).first()
    if worker is None or not worker.cancel_requested:
        return "nothing to cancel"
    if not worker.scheduler_job_id:
        lifecycle.confirm_job_gone(worker)
        return "no job"
    adapter = adapter_for(worker.cluster)
    try:
        adapter.cancel(worker.scheduler_job_id)
        result = adapter.query([worker.scheduler_job_id])
    except (SSHError, QueryFailed, SchedulerError) as exc:
        note_cluster_contact(worker.cluster, error=str(exc))
        raise CancelNotConfirmed(str(exc)) from exc
    note_cluster_contact(worker.cluster)
    info = result.get(worker.scheduler_job_id)
    if info is None or info.phase is Phase.ENDED:
        lifecycle.confirm_job_gone(worker)
        return "cancelled"
    raise CancelNotConfirmed(f"job {worker.scheduler_job_id} is still {info.state}")


class CancelNotConfirmed(Exception):
    """The job may still hold its allocation; the cancel is retried."""


def _apply(worker: Worker, info: JobInfo | None, adapter: SchedulerAdapter) -> None:
    if worker.cancel_requested and info is not None and info.phase is not Phase.ENDED:
        from workers_app import tasks

        tasks.cancel_worker_job.delay(worker.pk)
    if info is not None and info.phase is Phase.QUEUED:
        if worker.status in (S.STARTING, S.CONNECTED):
            lifecycle.mark_requeued(worker, reason=f"Job {info.state}: back in the queue")
        return
    if info is not None and info.phase is Phase.RUNNING:
        if worker.status == S.QUEUED:
            lifecycle.mark_started(worker, hostname=info.node)
        return
    if worker.cancel_requested and worker.status != S.STOPPING:
        lifecycle.confirm_job_gone(worker)
        return
    final = info
    if final is None:
        try:
            final = adapter.final_state(worker.scheduler_job_id)
        except (SSHError, QueryFailed):
            return
    if final is None:
        lifecycle.mark_job_ended(worker, state="", exit_code="", failed=False)
    else:
        lifecycle.mark_job_ended(
            worker, state=final.state, exit_code=final.exit_code, failed=final.failed
        )


def poll_cluster(cluster_id: int) -> int:
    """One status query for all of a cluster's live jobs; returns how many workers it checked."""
    cluster = Cluster.objects.get(pk=cluster_id)
    workers = list(
        Worker.objects.filter(cluster=cluster)
        .filter(Q(status__in=WITH_JOB) | Q(cancel_requested=True))
        .exclude(scheduler_job_id="")
        .order_by("pk")
    )
    if not workers:
        return 0
    adapter = adapter_for(cluster)
    try:
        result = adapter.query([w.scheduler_job_id for w in workers])
    except (SSHError, QueryFailed) as exc:
        note_cluster_contact(cluster, error=str(exc))
        log.warning("poll of %s failed, keeping every status: %s", cluster.name, exc)
        return 0
    note_cluster_contact(cluster)
    for worker in workers:
        _apply(worker, result.get(worker.scheduler_job_id), adapter)
    return len(workers)


def probe_cluster(cluster_id: int) -> bool:
    """Check reachability and refresh auto-detected environments from the partitions."""
    cluster = Cluster.objects.get(pk=cluster_id)
    adapter = adapter_for(cluster)
    try:
        partitions = adapter.partitions()
    except (SSHError, QueryFailed, SchedulerError) as exc:
        note_cluster_contact(cluster, error=str(exc))
        return False
    note_cluster_contact(cluster)
    now = timezone.now()
    for partition in partitions:
        environment, created = Environment.objects.get_or_create(
            cluster=cluster,
            name=partition.name,
            defaults={"partition": partition.name, "source": EnvironmentSource.AUTO},
        )
        if environment.source != EnvironmentSource.AUTO:
            continue
        environment.nodes_total = partition.nodes_total
        environment.nodes_available = partition.nodes_available
        environment.nodes_updated_at = now
        environment.save(update_fields=["nodes_total", "nodes_available", "nodes_updated_at"])
        if created:
            EnvironmentField.objects.bulk_create(
                EnvironmentField(
                    environment=environment,
                    name=template.name,
                    label=template.label,
                    kind=template.kind,
                    default=template.default,
                    pattern=template.pattern,
                    required=template.required,
                    directive=template.directive,
                    position=position,
                )
                for position, template in enumerate(adapter.default_fields())
            )
    return True


def reconcile_cluster(cluster_id: int) -> list[str]:
    """Cancel platform-named jobs that belong to no live worker; returns their ids."""
    cluster = Cluster.objects.get(pk=cluster_id)
    adapter = adapter_for(cluster)
    try:
        prefix = job_name_prefix()
        jobs = adapter.list_platform_jobs(prefix)
    except (SSHError, QueryFailed) as exc:
        note_cluster_contact(cluster, error=str(exc))
        return []
    public_ids = {name.removeprefix(prefix): job_id for job_id, name in jobs.items()}
    live = set(
        Worker.objects.filter(cluster=cluster, public_id__in=public_ids, status__in=WITH_JOB)
        .exclude(cancel_requested=True)
        .values_list("public_id", flat=True)
    )
    # A pending worker may be mid-submit: its job is about to be recorded, not an orphan.
    live |= set(
        Worker.objects.filter(
            cluster=cluster, public_id__in=public_ids, status=S.PENDING
        ).values_list("public_id", flat=True)
    )
    orphans = [job_id for public_id, job_id in public_ids.items() if public_id not in live]
    for job_id in orphans:
        try:
            adapter.cancel(job_id)
            log.warning("cancelled orphan job %s on %s", job_id, cluster.name)
        except (SSHError, SchedulerError) as exc:
            log.warning("could not cancel orphan job %s on %s: %s", job_id, cluster.name, exc)
    return orphans

"""Jobs on clusters, over SSH: submit, cancel, poll and reconcile.

Every status change still goes through ``lifecycle``; this module only decides which one,
from what a scheduler answered. A failed or doubtful answer changes nothing. A worker's job is
always spoken to as the account it runs under (the user's own, or a shared cluster's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from core import metrics as families
from core.bulk import update_each
from core.locks import submission_locks
from core.transport.connection import commands_run_total
from core.transport.errors import AuthenticationFailed, CommandTimeout, SSHError
from node import agent_source
from schedulers.base import (
    JobInfo,
    JobSpec,
    Phase,
    QueryFailed,
    SchedulerAdapter,
    SchedulerError,
    SchedulerUnavailable,
)
from workers_app import effects
from workers_app.actions import lifecycle
from workers_app.actions.clusters import note_cluster_contact
from workers_app.agent_keys import AgentKey, issue_agent_key
from workers_app.cluster_access import KeyUnusable, adapter_for, adapter_for_worker
from workers_app.models import Cluster, ClusterAccount, Worker, job_name_prefix
from workers_app.relays import RelayNotReady, agent_url_for
from workers_app.statuses import WITH_JOB, WorkerStatus
from workers_app.terminals import kept

S = WorkerStatus
log = logging.getLogger(__name__)

MAX_BACKOFF = 300.0

AGENT_HEREDOC = "ACTIVATE_AGENT_EOF"


# -- submission, top to bottom -----------------------------------------------------------------


def submit_worker(worker_id: int) -> str:
    """Send a pending worker's job to its cluster, exactly once. Returns what happened."""
    return submit_workers([worker_id])[worker_id]


def submit_workers(worker_ids: list[int]) -> dict[int, str]:
    """Send pending workers' jobs to their clusters, exactly once each; what happened to each.

    Workers waiting for the same (cluster, account) go together: one lookup for those an
    earlier attempt may have submitted, then their job scripts in as few commands as the
    adapter allows (``submit_many``).
    """
    outcomes = dict.fromkeys(worker_ids, "not pending")
    groups: dict[tuple[int, int | None], list[int]] = {}
    pending = (
        Worker.objects.filter(pk__in=worker_ids, status=S.PENDING)
        .order_by("pk")
        .values_list("pk", "cluster_id", "account_id")
    )
    for pk, cluster_id, account_id in pending:
        groups.setdefault((cluster_id, account_id), []).append(pk)
    for ids in groups.values():
        outcomes.update(_submit_group(ids))
    return outcomes


def _submit_group(worker_ids: list[int]) -> dict[int, str]:
    """Submit workers of one (cluster, account), each under its own submission lock."""
    with submission_locks(worker_ids) as taken:
        outcomes = {
            pk: "not pending" if pk in taken else "another submission is in progress"
            for pk in worker_ids
        }
        workers = list(Worker.objects.filter(pk__in=taken, status=S.PENDING).order_by("pk"))
        if workers:
            _share_cluster_and_account(workers)
            outcomes.update(_submit_locked(workers))
    return outcomes


def _share_cluster_and_account(workers: list[Worker]) -> None:
    """The group's one cluster and account, read once and set on each (not a copy a row)."""
    cluster = Cluster.objects.get(pk=workers[0].cluster_id)
    account_id = workers[0].account_id
    account = None if account_id is None else ClusterAccount.objects.get(pk=account_id)
    for worker in workers:
        worker.cluster, worker.account = cluster, account


def _submit_locked(workers: list[Worker]) -> dict[int, str]:
    """Lease the workers, send their jobs, then record each answer through the lifecycle."""
    cluster = workers[0].cluster
    # Should this process die mid-submit, the dispatch sweep sends them again later.
    lifecycle.lease_submissions(
        workers, until=timezone.now() + timedelta(seconds=settings.ACTIVATE_SUBMIT_LEASE)
    )
    try:
        adopted, fresh, results = _send_jobs(workers)
    except AuthenticationFailed as exc:
        return _login_refused(workers, cluster, exc)
    except (SSHError, QueryFailed, SchedulerUnavailable) as exc:
        # Unknown outcome (sbatch may have made the jobs): the next attempt looks them up.
        if isinstance(exc, SSHError | QueryFailed):
            note_cluster_contact(cluster, error=exc)
        return {w.pk: _wait_for_cluster(w, cluster, exc) for w in workers}
    except SchedulerError as exc:
        note_cluster_contact(cluster)
        for worker in workers:
            lifecycle.fail_worker(worker, reason=f"The scheduler refused the job: {exc}")
        families.SUBMISSIONS.labels(cluster.name, "refused").inc(len(workers))
        return dict.fromkeys((w.pk for w in workers), "refused")
    note_cluster_contact(cluster)
    for worker, job_id in adopted:
        lifecycle.record_event(worker, f"Found job {job_id} already submitted; adopted it")
    outcomes = _record_submitted(adopted, outcome="adopted")
    made = []
    for worker, result in zip(fresh, results, strict=True):
        if isinstance(result, SchedulerUnavailable):
            outcomes[worker.pk] = _wait_for_cluster(worker, cluster, result)
        elif isinstance(result, SchedulerError):
            lifecycle.fail_worker(worker, reason=f"The scheduler refused the job: {result}")
            families.SUBMISSIONS.labels(cluster.name, "refused").inc()
            outcomes[worker.pk] = "refused"
        else:
            made.append((worker, result))
    outcomes.update(_record_submitted(made))
    return outcomes


def _send_jobs(
    workers: list[Worker],
) -> tuple[list[tuple[Worker, str]], list[Worker], list[str | SchedulerError]]:
    """Adopt the jobs an earlier attempt made (found by name), submit the others' jobs: the
    adopted with their job ids, the fresh, and each fresh one's job id or refusal."""
    adapter = adapter_for_worker(workers[0])
    # Found by the key the last attempt committed (its own name, or its task of an array).
    retried = [w.job_key for w in workers if _may_have_a_job(w)]
    found = adapter.find_jobs(retried) if retried else {}
    adopted = [(w, found[w.job_key]) for w in workers if w.job_key in found]
    fresh = [w for w in workers if w.job_key not in found]
    if not fresh:
        return adopted, fresh, []
    by_name = {w.job_name: w for w in fresh}

    def with_new_secrets(specs: list[JobSpec]) -> list[JobSpec]:
        return _specs_with_new_secrets(specs, by_name)

    # Keyed a command's worth at a time: the first command starts while the rest are keyed.
    unkeyed = [
        JobSpec(name=w.job_name, partition=w.job_partition, directives=list(w.job_directives))
        for w in fresh
    ]
    return adopted, fresh, adapter.submit_many(unkeyed, prepare=with_new_secrets)


def _may_have_a_job(worker: Worker) -> bool:
    """Whether an earlier attempt may have created this worker's job.

    Every attempt commits a fresh agent secret before it runs the submit command, so a worker
    that never had a secret never had a job, and its first attempt skips the lookup (a third of
    a submission's time). Inside a caller's transaction that commit is not durable yet.
    """
    return bool(worker.agent_secret_hash) or transaction.get_connection().in_atomic_block


def _specs_with_new_secrets(specs: list[JobSpec], by_name: dict[str, Worker]) -> list[JobSpec]:
    """Each spec's worker's job with a fresh agent key, whose hash is committed before any
    submit command runs (so a worker with a hash may have a job, and one without never had),
    with the key its job will be found by (a task of an array, as the adapter chose)."""
    workers = [by_name[spec.name] for spec in specs]
    keys = []
    for worker, spec in zip(workers, specs, strict=True):
        key = issue_agent_key(worker.public_id)
        worker.agent_secret_hash = key.key_hash
        worker.job_task = spec.key if spec.array else ""
        keys.append(key)
    update_each(
        Worker,
        {w.pk: {"agent_secret_hash": w.agent_secret_hash, "job_task": w.job_task} for w in workers},
    )
    return [
        replace(job_spec(w, key), array=spec.array, index=spec.index)
        for w, key, spec in zip(workers, keys, specs, strict=True)
    ]


def job_spec(worker: Worker, key: AgentKey) -> JobSpec:
    """The job as validated when the worker was requested, whatever its environment is now."""
    command = (
        f"{kept.SERVER_START}\n"
        f"exec python3 - <<'{AGENT_HEREDOC}'\n{agent_source()}\n{AGENT_HEREDOC}"
    )
    return JobSpec(
        name=worker.job_name,
        partition=worker.job_partition,
        directives=list(worker.job_directives),
        environment={
            # The agents' server, or the relay on the login host (agents go via the login host).
            "ACTIVATE_URL": agent_url_for(worker.cluster),
            "ACTIVATE_WORKER_ID": worker.public_id,
            # The agent signs with the key and never sends it: given once, here, in the job.
            "ACTIVATE_AGENT_KEY_ID": key.key_id,
            "ACTIVATE_AGENT_KEY": key.key,
            "ACTIVATE_HEARTBEAT_INTERVAL": f"{settings.ACTIVATE_HEARTBEAT_INTERVAL:g}",
        },
        command=command,
    )


def _record_submitted(
    made: list[tuple[Worker, str]], *, outcome: str = "submitted"
) -> dict[int, str]:
    """Each worker queued with its job, in one compare-and-set for all; a worker that ended
    meanwhile has its job cancelled."""
    if not made:
        return {}
    queued = {worker.pk for worker in lifecycle.mark_submitted_many(made)}
    families.SUBMISSIONS.labels(made[0][0].cluster.name, outcome).inc(len(queued))
    outcomes = {}
    for worker, job_id in made:
        if worker.pk in queued:
            outcomes[worker.pk] = f"submitted as job {job_id}"
            continue
        record_job_to_cancel(worker, job_id=job_id)
        families.SUBMISSIONS.labels(worker.cluster.name, "ended_meanwhile").inc()
        outcomes[worker.pk] = f"worker ended meanwhile; cancelling job {job_id}"
    return outcomes


def record_job_to_cancel(worker: Worker, *, job_id: str) -> None:
    """A job was created for a worker that ended meanwhile: keep its id and cancel it."""
    Worker.objects.filter(pk=worker.pk).update(scheduler_job_id=job_id, cancel_requested=True)
    worker.scheduler_job_id, worker.cancel_requested = job_id, True
    lifecycle.record_event(
        worker, f"Job {job_id} was created after the worker ended; cancelling it"
    )
    effects.cancel_worker_job(worker.pk)


def _login_refused(
    workers: list[Worker], cluster: Cluster, exc: AuthenticationFailed
) -> dict[int, str]:
    if workers[0].account is None:
        # The cluster's own (shared) account: an operator's matter, worth waiting for.
        note_cluster_contact(cluster, error=exc)
        return {w.pk: _wait_for_cluster(w, cluster, exc) for w in workers}
    note_account_refused(workers[0].account, str(exc))
    for worker in workers:
        lifecycle.fail_worker(worker, reason=reason_for_users(cluster, exc))
    families.SUBMISSIONS.labels(cluster.name, "account_refused").inc(len(workers))
    return dict.fromkeys((w.pk for w in workers), "account refused")


def _wait_for_cluster(worker: Worker, cluster: Cluster, exc: Exception) -> str:
    delay = retry_delay(worker.submit_attempts)
    lifecycle.note_waiting(
        worker,
        reason=f"Waiting for cluster {cluster.name}: {reason_for_users(cluster, exc)}",
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
    )
    log.warning("submission of %s waits %gs: %s", worker.public_id, delay, exc)
    families.SUBMISSIONS.labels(cluster.name, "waiting").inc()
    return f"cluster unavailable, retry in {delay:g}s"


def retry_delay(attempts: int) -> float:
    return float(min(MAX_BACKOFF, 5 * 2 ** min(attempts, 10)))


def reason_for_users(cluster: Cluster, exc: Exception) -> str:
    """Why, in words for the worker's owner: never the cluster's host or another account (the
    whole message is in the cluster's last error and the log, for operators)."""
    if isinstance(exc, AuthenticationFailed) and not cluster.shared:
        return (
            f"cluster {cluster.name} refused your account's login; check it on the Clusters "
            "page (pw cluster verify)"
        )
    if isinstance(exc, KeyUnusable):
        return f"cluster {cluster.name} is misconfigured on the platform; an operator must fix it"
    if isinstance(exc, RelayNotReady):
        return f"the relay on the login host of {cluster.name} is not up yet"
    if isinstance(exc, CommandTimeout):
        return f"cluster {cluster.name} did not answer in time"
    if isinstance(exc, SSHError):
        return f"cluster {cluster.name} cannot be reached"
    return f"the scheduler on {cluster.name} is not answering"


def note_account_refused(account: ClusterAccount | None, error: str) -> None:
    """A user's login was refused: their account needs attention, the cluster is fine."""
    if account is not None:
        ClusterAccount.objects.filter(pk=account.pk).update(
            verified_at=None, last_error=error[:2000]
        )


# -- cancelling --------------------------------------------------------------------------------


def cancel_worker_job(worker_id: int) -> str:
    """Ask the scheduler to end a worker's job, if an attempt is due (the first one is).

    Done only when a query no longer lists the job. A failed attempt is not retried here: the
    poll makes the next one when it is due, so a job that will not die costs one attempt per
    backoff period, never a growing number of retry chains.
    """
    worker = Worker.objects.select_related("cluster", "account").filter(pk=worker_id).first()
    if worker is None or not worker.cancel_requested:
        return "nothing to cancel"
    if not worker.scheduler_job_id:
        confirm_job_gone(worker)
        families.CANCELS.labels(worker.cluster.name, "no_job").inc()
        return "no job"
    try:
        adapter = adapter_for_worker(worker)
    except SSHError as exc:
        families.CANCELS.labels(worker.cluster.name, "unreachable").inc()
        return f"cannot reach the cluster: {exc}"
    return attempt_cancel(worker, adapter)


def _claim_cancel_attempt(worker: Worker, now: datetime) -> bool:
    """Only one attempt at a time: whoever moves the next due time forward makes it."""
    due = Q(next_cancel_at__isnull=True) | Q(next_cancel_at__lte=now)
    claimed = (
        Worker.objects.filter(due, pk=worker.pk, cancel_requested=True)
        .filter(cancel_attempts=worker.cancel_attempts)
        .update(
            cancel_attempts=F("cancel_attempts") + 1,
            next_cancel_at=now + timedelta(seconds=retry_delay(worker.cancel_attempts)),
        )
    )
    if claimed:
        worker.cancel_attempts += 1
    return claimed == 1


def attempt_cancel(worker: Worker, adapter: SchedulerAdapter) -> str:
    job_id = worker.scheduler_job_id
    if not _claim_cancel_attempt(worker, timezone.now()):
        return "the next cancel attempt is not due"
    cancels = families.CANCELS
    try:
        adapter.cancel(job_id)
        result = adapter.query([job_id])
    except (SSHError, QueryFailed) as exc:
        if isinstance(exc, AuthenticationFailed) and worker.account is not None:
            note_account_refused(worker.account, str(exc))  # theirs, not the cluster's
        else:
            note_cluster_contact(worker.cluster, error=exc)
        cancels.labels(worker.cluster.name, "not_confirmed").inc()
        return f"cancel of job {job_id} not confirmed: {exc}"
    except SchedulerError as exc:
        note_cluster_contact(worker.cluster)
        cancels.labels(worker.cluster.name, "refused").inc()
        return f"the scheduler refused to cancel job {job_id}: {exc}"
    note_cluster_contact(worker.cluster)
    info = result.get(job_id)
    if info is None or info.phase is Phase.ENDED:
        confirm_job_gone(worker)
        cancels.labels(worker.cluster.name, "cancelled").inc()
        return "cancelled"
    cancels.labels(worker.cluster.name, "still_listed").inc()
    return f"job {job_id} is still {info.state}"


def confirm_job_gone(worker: Worker) -> None:
    """The scheduler no longer lists the job we asked to cancel."""
    if worker.status == S.STOPPING:
        lifecycle.mark_job_ended(worker, state="CANCELLED", exit_code="", failed=False)
    Worker.objects.filter(pk=worker.pk).update(cancel_requested=False, next_cancel_at=None)
    worker.cancel_requested, worker.next_cancel_at = False, None


# -- polling and reconciling -------------------------------------------------------------------


def _apply(worker: Worker, info: JobInfo | None, adapter: SchedulerAdapter) -> None:
    if worker.cancel_requested and info is not None and info.phase is not Phase.ENDED:
        if attempt_cancel(worker, adapter) == "cancelled":
            return
    if info is not None and info.phase is Phase.QUEUED:
        if worker.status in (S.STARTING, S.CONNECTED):
            lifecycle.mark_requeued(worker, reason=f"Job {info.state}: back in the queue")
        return
    if info is not None and info.phase is Phase.RUNNING:
        if worker.status == S.QUEUED:
            lifecycle.mark_started(worker, hostname=info.node)
        return
    if worker.cancel_requested and worker.status != S.STOPPING:
        confirm_job_gone(worker)
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


def _by_account(workers: list[Worker]) -> dict[int | None, list[Worker]]:
    groups: dict[int | None, list[Worker]] = {}
    for worker in workers:
        groups.setdefault(worker.account_id, []).append(worker)
    return groups


def poll_cluster(cluster_id: int) -> int:
    """One status query per account with live jobs; returns how many workers it checked.

    Each account sees its own jobs only, so each is asked as itself.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    started, commands = time.monotonic(), commands_run_total()
    workers = list(
        Worker.objects.filter(cluster=cluster)
        .to_poll()
        .exclude(scheduler_job_id="")
        .select_related("account")
        .order_by("pk")
    )
    checked = 0
    for group in _by_account(workers).values():
        account = group[0].account
        try:
            adapter = adapter_for(cluster, account)
            result = adapter.query([w.scheduler_job_id for w in group])
        except AuthenticationFailed as exc:
            note_account_refused(account, str(exc))
            log.warning("poll of %s as %s refused, keeping every status: %s", cluster, account, exc)
            continue
        except (SSHError, QueryFailed) as exc:
            note_cluster_contact(cluster, error=exc)
            log.warning("poll of %s failed, keeping every status: %s", cluster.name, exc)
            continue
        note_cluster_contact(cluster)
        for worker in group:
            worker.cluster = cluster
            _apply(worker, result.get(worker.scheduler_job_id), adapter)
        checked += len(group)
    # A Celery process runs one task at a time, so the process's count is this poll's.
    families.POLL_COMMANDS.labels(cluster.name).observe(commands_run_total() - commands)
    families.POLL_CYCLE.labels(cluster.name).observe(time.monotonic() - started)
    return checked


def reconcile_cluster(cluster_id: int) -> list[str]:
    """Cancel platform-named jobs that belong to no live worker; returns their ids.

    Each account that has run workers here is asked as itself (and the cluster's own account,
    if it has one).
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    accounts: list[ClusterAccount | None] = list(
        ClusterAccount.objects.filter(cluster=cluster, workers__isnull=False).distinct()
    )
    if cluster.username and cluster.has_private_key:
        accounts.insert(0, None)
    orphans: list[str] = []
    for account in accounts:
        orphans += _reconcile_account(cluster, account)
    return orphans


def _reconcile_account(cluster: Cluster, account: ClusterAccount | None) -> list[str]:
    prefix = job_name_prefix()
    try:
        adapter = adapter_for(cluster, account)
        jobs = adapter.list_platform_jobs(prefix)
    except (SSHError, QueryFailed) as exc:
        log.warning("reconcile of %s as %s failed: %s", cluster.name, account or "its own", exc)
        return []
    keys = set(jobs.values())
    named = Q(public_id__in={key.removeprefix(prefix) for key in keys}, job_task="")
    workers = {
        worker.job_key: worker
        for worker in Worker.objects.filter(named | Q(job_task__in=keys), cluster=cluster).only(
            "public_id", "job_task", "status", "scheduler_job_id", "cancel_requested"
        )
    }
    orphans = [
        job_id for job_id, key in jobs.items() if not _job_is_wanted(job_id, workers.get(key))
    ]
    for job_id in orphans:
        try:
            adapter.cancel(job_id)
            log.warning("cancelled orphan job %s on %s", job_id, cluster.name)
        except (SSHError, SchedulerError, ValueError) as exc:
            # One job that cannot be cancelled must not keep the others alive.
            log.warning("could not cancel orphan job %s on %s: %s", job_id, cluster.name, exc)
    return orphans


def _job_is_wanted(job_id: str, worker: Worker | None) -> bool:
    if worker is None:
        return False
    if worker.status == S.PENDING:
        # Mid-submit: its job is about to be recorded, not an orphan.
        return True
    return (
        worker.status in WITH_JOB
        and not worker.cancel_requested
        and worker.scheduler_job_id == job_id
    )

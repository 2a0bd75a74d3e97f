"""Actions on workers that views, the API, the admin, the CLI and tasks call."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from workers_app import effects, idle, lifecycle, signals, usage
from workers_app.accounts import acting_account
from workers_app.bulk import insert_all
from workers_app.connections import adapter_for_worker
from workers_app.models import Cluster, Environment, SavedRequest, Worker, WorkerCommand
from workers_app.models.idle import IdlePolicy
from workers_app.params import ParameterError, directives_for, validate_params
from workers_app.redis_connection import redis_client
from workers_app.schedulers import adapter_class
from workers_app.schedulers.base import CommandResult, QueryFailed, SchedulerError
from workers_app.statuses import WorkerStatus
from workers_app.transport.errors import SSHError

NAME_MAX = 128
# Workers one request may ask for.
BULK_MAX = 500
SAVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def request_worker(
    *,
    owner: User,
    cluster: str,
    environment: str,
    params: Mapping[str, object] | None = None,
    name: str = "",
    idempotency_key: str = "",
    idle_minutes: float | None = None,
) -> Worker:
    """Validate a worker request and record it as pending; submission follows after commit.

    What will be submitted (partition and directives) is fixed here, from what was validated.
    Raises ParameterError naming the offending field; nothing is stored then. With an
    ``idempotency_key`` already used by this owner, the worker made then is the answer.
    """
    if idempotency_key:
        earlier = worker_requested_with(owner, idempotency_key)
        if earlier is not None:
            return earlier
    [worker] = _record_requests(
        owner=owner,
        cluster=cluster,
        environment=environment,
        params=params,
        names=[name.strip()],
        keys=[idempotency_key],
        idle_minutes=idle_minutes,
    )
    return worker


def request_workers(
    *,
    owner: User,
    cluster: str,
    environment: str,
    count: int,
    params: Mapping[str, object] | None = None,
    name: str = "",
    idempotency_key: str = "",
    idle_minutes: float | None = None,
) -> list[Worker]:
    """``count`` workers alike, in one transaction and with one message to submit them all.

    Named ``<name>-1`` ... ``<name>-N`` when a name is given. An ``idempotency_key`` covers the
    whole request: repeated, it answers the workers made then (whatever the count says now).
    """
    if not 1 <= count <= BULK_MAX:
        raise ParameterError("count", f"must be from 1 to {BULK_MAX}")
    if idempotency_key:
        earlier = workers_requested_with(owner, idempotency_key)
        if earlier:
            return earlier
    name = name.strip()
    names = [f"{name}-{n}" if name else "" for n in range(1, count + 1)]
    keys = [_bulk_key(idempotency_key, n) if idempotency_key else "" for n in range(1, count + 1)]
    return _record_requests(
        owner=owner,
        cluster=cluster,
        environment=environment,
        params=params,
        names=names,
        keys=keys,
        idle_minutes=idle_minutes,
    )


def _bulk_key(idempotency_key: str, n: int) -> str:
    # Each worker keeps the request's key with its place in the request, so a retry finds all.
    return f"{idempotency_key}#{n}"


def _active_environment(cluster: str, environment: str) -> Environment:
    found_cluster = Cluster.objects.filter(name=cluster).first()
    if found_cluster is None:
        raise ParameterError("cluster", f"unknown cluster {cluster!r}")
    env = (
        Environment.objects.filter(cluster=found_cluster, name=environment)
        .select_related("cluster")
        .prefetch_related("fields")
        .first()
    )
    if env is None:
        raise ParameterError("environment", f"unknown environment {environment!r} on {cluster}")
    if not env.is_active:
        raise ParameterError("environment", f"environment {environment!r} is inactive")
    return env


def _record_requests(
    *,
    owner: User,
    cluster: str,
    environment: str,
    params: Mapping[str, object] | None,
    names: list[str],
    keys: list[str],
    idle_minutes: float | None,
) -> list[Worker]:
    """``idle_minutes``: the idle policy (0: none; None: the site's default)."""
    env = _active_environment(cluster, environment)
    found_cluster = env.cluster
    for name in names:
        if len(name) > NAME_MAX or not name.isprintable():
            raise ParameterError(
                "name", f"must be at most {NAME_MAX} printable characters (no control characters)"
            )
    problem = idle.policy_problem(idle_minutes)
    if problem:
        raise ParameterError("idle_minutes", problem)
    if idle_minutes is None:
        idle_minutes = idle.site_default(env)
    account = acting_account(owner, found_cluster)
    resolved = validate_params(env, params or {}, scheduler=adapter_class(found_cluster.scheduler))
    directives = directives_for(env, resolved)
    now = timezone.now()
    workers = []
    for name, key in zip(names, keys, strict=True):
        worker = Worker(
            owner=owner,
            cluster=found_cluster,
            environment=env,
            account=account,
            params=resolved,
            job_partition=env.partition,
            job_directives=list(directives),
            idempotency_key=key,
            idle_minutes=idle_minutes or None,
            **lifecycle.initial_timing(now),
        )
        worker.name = name or f"{env.name}-{worker.public_id}"
        workers.append(worker)
    try:
        with transaction.atomic():
            # One request of this user at a time past here: caps count what is already held.
            User.objects.select_for_update().filter(pk=owner.pk).first()
            usage.check_caps(owner, found_cluster, adding=len(workers))
            if len(workers) == 1:
                workers[0].save()
            else:
                insert_all(workers, key="public_id")
            lifecycle.record_events(workers, "Requested")
            effects.submit_workers([w.pk for w in workers])
    except IntegrityError:
        # The same key, sent twice at once: the other request made the workers.
        key = keys[0]
        if not key:
            raise
        earlier = (
            [w for w in [worker_requested_with(owner, key)] if w is not None]
            if len(keys) == 1
            else workers_requested_with(owner, key.rpartition("#")[0])
        )
        if not earlier:
            raise
        return earlier
    return workers


def worker_requested_with(owner: User, idempotency_key: str) -> Worker | None:
    return (
        Worker.objects.select_related("cluster", "environment")
        .filter(owner=owner, idempotency_key=idempotency_key)
        .first()
    )


def workers_requested_with(owner: User, idempotency_key: str) -> list[Worker]:
    """The workers of an earlier bulk request with this key, in the order they were asked."""
    workers = (
        Worker.objects.select_related("cluster", "environment")
        .filter(owner=owner, idempotency_key__startswith=f"{idempotency_key}#")
        .filter(idempotency_key__regex=rf"^{re.escape(idempotency_key)}#[0-9]+$")
    )
    return sorted(workers, key=lambda w: int(w.idempotency_key.rpartition("#")[2]))


class NotOwner(Exception):
    """Only a worker's owner acts as its cluster account: runs commands, requests it again."""


def request_again(worker: Worker, *, owner: User, idempotency_key: str = "") -> Worker:
    """Another worker like ``worker``: its cluster, environment, fields and name, the fields
    validated as the environment has them now."""
    if worker.owner_id != owner.pk:
        raise NotOwner("only the worker's owner may request it again")
    env = worker.environment
    if env is None:
        raise ParameterError(
            "environment", f"the environment worker {worker.public_id} came from was removed"
        )
    # A name the platform gave (ENV-ID) would carry the old id: the new one gets its own.
    name = "" if worker.name == f"{env.name}-{worker.public_id}" else worker.name
    return request_worker(
        owner=owner,
        cluster=worker.cluster.name,
        environment=env.name,
        params=worker.params,
        name=name,
        idempotency_key=idempotency_key,
        idle_minutes=worker.idle_minutes or 0,
    )


def save_request(
    *, owner: User, name: str, cluster: str, environment: str, params: Mapping[str, object]
) -> tuple[SavedRequest, bool]:
    """Keep a request under ``name`` (replacing one of that name): the fields are validated
    now and kept with their defaults filled in. Returns it and whether it is new."""
    if not SAVED_NAME.fullmatch(name):
        raise ParameterError(
            "name", "must be 1-64 letters, digits, '-' or '_', starting with a letter or digit"
        )
    env = _active_environment(cluster, environment)
    resolved = validate_params(env, params, scheduler=adapter_class(env.cluster.scheduler))
    return SavedRequest.objects.update_or_create(
        owner=owner, name=name, defaults={"environment": env, "params": resolved}
    )


def saved_requests_of(owner: User) -> QuerySet[SavedRequest]:
    return SavedRequest.objects.filter(owner=owner).select_related("environment__cluster")


def delete_saved_request(saved: SavedRequest) -> None:
    saved.delete()


def delete_worker(worker: Worker, *, reason: str = lifecycle.REASON_DELETED) -> bool:
    """Delete a worker: its sessions go, its job is cancelled; the row stays for the history."""
    with transaction.atomic():
        signals.worker_deleted.send(sender=Worker, worker=worker)
        return lifecycle.request_stop(worker, reason=reason)


def _idle_parts(subject: IdlePolicy) -> tuple[Worker, IdlePolicy | None]:
    """The worker a policy's subject is on, and the session when the subject is one."""
    if isinstance(subject, Worker):
        return subject, None
    return subject.worker, subject  # type: ignore[attr-defined]


def warn_idle(subject: IdlePolicy, now: datetime, *, live: str) -> bool:
    """Tell the owner that their idle worker (or session) ends a warning's lead from now; once,
    and only while it is ``live`` (its status)."""
    worker, session = _idle_parts(subject)
    with transaction.atomic():
        # Any model with a policy and a status: the keywords are checked when it runs.
        unwarned = {"pk": subject.pk, "status": live, "idle_warned_at__isnull": True}
        warned = type(subject)._default_manager.filter(**unwarned).update(idle_warned_at=now)
        if warned:
            subject.idle_warned_at = now
            lead = idle.warning_lead(idle.policy_seconds(subject.idle_minutes) or 0)
            signals.idle_warning.send(
                sender=type(subject),
                worker=worker,
                session=session,
                ends_at=now + timedelta(seconds=lead),
            )
    return bool(warned)


def reset_idle(subject: IdlePolicy, *, kept_at: datetime | None = None) -> bool:
    """Take a warning back (busy again); with ``kept_at`` (Keep), the clock starts there."""
    worker, session = _idle_parts(subject)
    changes: dict[str, datetime | None] = {"idle_warned_at": None}
    if kept_at is not None:
        changes["idle_kept_at"] = kept_at
    with transaction.atomic():
        changed = type(subject)._default_manager.filter(pk=subject.pk).update(**changes)
        signals.idle_warning_cleared.send(sender=type(subject), worker=worker, session=session)
    for field, value in changes.items():
        setattr(subject, field, value)
    return bool(changed)


def keep_worker(worker: Worker, *, owner: User) -> None:
    """Keep: the idle clock starts again now, and any warning is taken back."""
    if worker.owner_id != owner.pk:
        raise NotOwner("only the worker's owner can keep it")
    reset_idle(worker, kept_at=timezone.now())


def end_idle_worker(worker: Worker) -> bool:
    assert worker.idle_minutes is not None
    return delete_worker(worker, reason=idle.idle_reason(worker.idle_minutes))


def workers_visible_to(user: User) -> QuerySet[Worker]:
    """What a user's lists show: their own (staff: everyone's), minus long-finished workers."""
    workers = Worker.objects.visible(timezone.now())
    if not getattr(user, "is_staff", False):
        workers = workers.filter(owner=user)
    return workers


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

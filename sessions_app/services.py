"""Actions on sessions that pages, the API, `pw`, tasks and the worker signals call.

Statuses change only through ``sessions_app.lifecycle``; the program on the node is started and
stopped through ``sessions_app.launch``.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.errors import ParameterError
from core.folders import checked_folder
from core.statemachine import enqueue_on_commit
from core.transport.errors import SSHError
from schedulers.base import QueryFailed, SchedulerError
from sessions_app import kinds, launch, lifecycle
from sessions_app.models import Session
from sessions_app.statuses import LIVE, SessionStatus
from workers_app import idle
from workers_app.actions import lifecycle as worker_lifecycle
from workers_app.actions.deletion import delete_worker
from workers_app.actions.requests import request_worker
from workers_app.models import Worker
from workers_app.statuses import FINISHED as WORKER_FINISHED
from workers_app.statuses import WorkerStatus

S = SessionStatus
log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
START_TASK = "sessions_app.tasks.start_session"
STOP_TASK = "sessions_app.tasks.stop_program"
# A start claimed this long ago and still not done: its process died; the session fails.
START_TIMEOUT = timedelta(seconds=300)
# The reason a start that broke off on the way is tried again under; its events count the tries.
RETRYING = "Starting again after: "
# The session sweep reads ready sessions this many at a time.
SWEEP_BATCH = 200


def default_name(session_type: str) -> str:
    return f"{session_type}_{timezone.now():%Y%m%d_%H%M%S}"


def create_session(
    *,
    owner: User,
    session_type: str,
    cluster: str,
    environment: str = "",
    worker_id: str = "",
    params: Mapping[str, object] | None = None,
    name: str = "",
    idle_minutes: float | None = None,
    values: Mapping[str, object] | None = None,
    folder: str = "",
) -> Session:
    """A session on an environment (a dedicated worker is requested for it) or on a connected
    worker of the owner's. Raises ParameterError naming the offending field."""
    try:
        kind = kinds.get(session_type)
    except kinds.UnknownKind:
        kind = None
    if kind is None or not kind.seen_by(owner):
        offered = ", ".join(k.name for k in kinds.seen_by(owner))
        raise ParameterError("type", f"must be one of {offered}")
    checked_values = kind.checked_values(values or {})
    folder = checked_folder(folder)
    name = name.strip() or default_name(session_type)
    if not NAME.fullmatch(name):
        raise ParameterError("name", "must be 1 to 64 letters, digits or underscores")
    if bool(environment) == bool(worker_id):
        raise ParameterError("environment", "give either an environment or a worker, not both")
    problem = idle.policy_problem(idle_minutes)
    if problem:
        raise ParameterError("idle_minutes", problem)
    with transaction.atomic():
        if environment:
            if not kind.offered_on(cluster, environment):
                where = f"{cluster}/{environment}"
                raise ParameterError("type", f"{kind.label} is not offered on {where}")
            # The session's policy is the worker's: ending the session ends its worker.
            worker = request_worker(
                owner=owner,
                cluster=cluster,
                environment=environment,
                params=params,
                name=name,
                idle_minutes=0,
            )
            if idle_minutes is None and worker.environment is not None:
                idle_minutes = idle.site_default(worker.environment)
            dedicated = True
        else:
            if params:
                raise ParameterError("params", "scheduling fields apply to a new worker only")
            found = Worker.objects.select_related("cluster").filter(
                owner=owner, public_id=worker_id
            )
            worker_found = found.first()
            if worker_found is None or worker_found.cluster.name != cluster:
                raise ParameterError("worker", f"no worker {worker_id!r} of yours on {cluster}")
            if worker_found.status != WorkerStatus.CONNECTED:
                raise ParameterError(
                    "worker", f"worker {worker_id} is {worker_found.status}, not connected"
                )
            worker, dedicated = worker_found, False
            from_environment = worker.environment.name if worker.environment else None
            if not kind.offered_on(cluster, from_environment):
                raise ParameterError("type", f"{kind.label} is not offered on worker {worker_id}")
        session = Session(
            name=name,
            owner=owner,
            session_type=session_type,
            worker=worker,
            dedicated_worker=dedicated,
            idle_minutes=idle_minutes or None,
            values=checked_values,
            folder=folder,
        )
        session.set_secret(secrets.token_urlsafe(24)[: kind.secret_length])
        session.save()
        lifecycle.record_requested(session)
        enqueue_on_commit(START_TASK, session.pk)
    return session


def create_again(session: Session) -> Session:
    """Another session like ``session``, for its owner: of its kind, on a new worker like its
    dedicated one, or on the same worker while that is still connected."""
    worker = session.worker
    asked: dict[str, Any] = {
        "owner": session.owner,
        "session_type": session.session_type,
        "cluster": worker.cluster.name,
        "values": session.values,
        "folder": session.folder,
    }
    asked["idle_minutes"] = session.idle_minutes or 0
    if not session.dedicated_worker:
        return create_session(**asked, worker_id=worker.public_id)
    if worker.environment is None:
        raise ParameterError(
            "environment", f"the environment session {session.public_id} came from was removed"
        )
    return create_session(**asked, environment=worker.environment.name, params=worker.params)


def sessions_visible_to(user: User) -> QuerySet[Session]:
    """A user's own sessions (staff too: a session acts as its owner)."""
    return Session.objects.select_related(
        "worker", "worker__cluster", "worker__environment"
    ).filter(owner=user)


def find_session(user: User, public_id: str) -> Session | None:
    return sessions_visible_to(user).filter(public_id=public_id).first()


def start_session(session_id: int) -> str:
    """Start a pending session's program if its worker is connected.

    Returns "waiting" (its worker is not connected yet), "retrying" (the start broke off on the
    way; try again in a few seconds), "running", "failed" or "gone" (nothing to do).
    """
    session = (
        Session.objects.select_related("worker", "worker__cluster", "worker__account")
        .filter(pk=session_id)
        .first()
    )
    if session is None or session.status != S.PENDING:
        return "gone"
    worker = session.worker
    if worker.status in WORKER_FINISHED:
        # The signal ends sessions of finished workers; this catches one created meanwhile.
        lifecycle.end_session(session, reason=worker.status_reason or "Its worker ended")
        return "gone"
    if worker.status != WorkerStatus.CONNECTED or not worker.scheduler_job_id:
        return "waiting"
    if not lifecycle.claim_start(session):
        return "gone"
    retried = session.events.filter(reason__startswith=RETRYING).count()
    try:
        if retried:
            launch.end_earlier_launchers(session)
        launched = launch.launch(session)
    except launch.LaunchFailed as exc:
        lifecycle.fail_session(session, reason=f"Could not start: {exc}"[:512])
        return "failed"
    except (SSHError, QueryFailed, SchedulerError, ValueError) as exc:
        worker.refresh_from_db(fields=["status"])
        if worker.status != WorkerStatus.CONNECTED:
            lifecycle.release_start(session, reason="Waiting for its worker")
            return "waiting"
        transient = isinstance(exc, SSHError | QueryFailed)
        if transient and retried < settings.ACTIVATE_SESSION_START_RETRIES:
            lifecycle.release_start(session, reason=f"{RETRYING}{exc}"[:512])
            return "retrying"
        lifecycle.fail_session(session, reason=f"Could not start: {exc}"[:512])
        return "failed"
    if not lifecycle.mark_running(
        session,
        node_host=launched.host,
        node_port=launched.port,
        node_pid=launched.pid,
        login_cookie=launched.login,
    ):
        # Stopped while it started: the program must not stay behind.
        session.node_pid = launched.pid
        _stop_quietly(session)
        return "gone"
    return "running"


def stop_session(
    session: Session,
    *,
    reason: str = lifecycle.REASON_STOPPED,
    worker_reason: str = worker_lifecycle.REASON_DELETED,
) -> bool:
    """End a session: its program stops; a dedicated worker is deleted (its job cancelled)."""
    with transaction.atomic():
        changed = lifecycle.end_session(session, reason=reason)
        if session.dedicated_worker:
            worker = Worker.objects.get(pk=session.worker_id)
            if worker.status not in WORKER_FINISHED:
                delete_worker(worker, reason=worker_reason)
        elif changed and session.node_pid is not None:
            enqueue_on_commit(STOP_TASK, session.pk)
    return changed


def stop_program(session_id: int) -> None:
    session = Session.objects.select_related("worker", "worker__cluster", "worker__account").get(
        pk=session_id
    )
    _stop_quietly(session)


def _stop_quietly(session: Session) -> None:
    try:
        launch.stop(session)
    except (SSHError, QueryFailed, SchedulerError, ValueError) as exc:
        # The job may be over already; a program left behind ends with it.
        log.info("could not stop the program of session %s: %s", session.public_id, exc)


REASON_PROGRAM_ENDED = "Its program ended on the node"


def check_program(session_id: int) -> bool:
    """The proxy could not reach a running session's port: end the session if its program is
    gone from the node. Returns whether it is still running."""
    session = (
        Session.objects.select_related("worker", "worker__cluster", "worker__account")
        .filter(pk=session_id, status=S.RUNNING)
        .first()
    )
    if session is None:
        return False
    try:
        running = launch.is_running(session)
    except (SSHError, QueryFailed, SchedulerError, ValueError):
        return True  # the cluster did not answer: nothing is known
    if not running:
        lifecycle.end_session(session, reason=REASON_PROGRAM_ENDED)
    return running


def sweep_sessions(now: datetime | None = None, *, batch: int = SWEEP_BATCH) -> int:
    """Queue starts of pending sessions whose worker is connected; fail starts that died.

    The ready sessions are read in batches by id and the sweep goes on while a batch comes back
    full, so none waits for a later beat behind the first ``batch``.
    """
    now = now or timezone.now()
    ready = Session.objects.filter(
        status=S.PENDING, worker__status=WorkerStatus.CONNECTED
    ).order_by("pk")
    queued, last = 0, 0
    while True:
        ids = list(ready.filter(pk__gt=last).values_list("pk", flat=True)[:batch])
        for session_id in ids:
            enqueue_on_commit(START_TASK, session_id)
        queued += len(ids)
        if len(ids) < batch:
            break
        last = ids[-1]
    for session in Session.objects.filter(status=S.STARTING, updated_at__lt=now - START_TIMEOUT):
        lifecycle.fail_session(session, reason="Could not start: the start was interrupted")
    return queued


def finish_sessions_of_worker(worker_id: int, *, reason: str, failed: bool) -> int:
    """Every live session of a worker that ended: ended, or failed with the worker's reason."""
    changed = 0
    for session in Session.objects.filter(worker_id=worker_id, status__in=LIVE):
        change = lifecycle.fail_session if failed else lifecycle.end_session
        changed += change(session, reason=reason or "Its worker ended")
    return changed


def delete_sessions_of_worker(worker_id: int) -> int:
    """A deleted worker's sessions end with it (its job, and so their programs, are cancelled)."""
    changed = 0
    for session in Session.objects.filter(worker_id=worker_id, status__in=LIVE):
        changed += lifecycle.end_session(session, reason=lifecycle.REASON_WORKER_DELETED)
    return changed


def end_sessions_whose_launcher_ended(worker_id: int, public_ids: list[str]) -> int:
    """The worker's agent saw these sessions' launchers end on its node: those of this worker
    still running end (another worker's, or a session not running, are left as they are)."""
    changed = 0
    running = Session.objects.filter(
        worker_id=worker_id, public_id__in=public_ids, status=S.RUNNING
    )
    for session in running:
        changed += lifecycle.end_session(session, reason=REASON_PROGRAM_ENDED)
    return changed

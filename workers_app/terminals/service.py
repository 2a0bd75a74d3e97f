"""Opening and closing terminals: who may, on which worker, how many, and the record of each."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from redis import RedisError

from core.errors import ParameterError
from core.folders import checked_folder, in_folder
from core.redis_connection import redis_client
from core.transport.errors import SSHError
from core.transport.streams import PtySize, Stream
from schedulers.base import QueryFailed, SchedulerError
from workers_app.cluster_access import open_stream
from workers_app.models import TerminalRecord, Worker
from workers_app.statuses import WorkerStatus
from workers_app.terminals.kept import KEEP_NAME, KEPT_TERMINAL

# WebSocket close codes (4000-4999 are the application's): the HTTP status they stand for.
UNAUTHENTICATED = 4401
FORBIDDEN_ORIGIN = 4403
NOT_FOUND = 4404
TIMED_OUT = 4408
NOT_CONNECTED = 4409
BAD_REQUEST = 4400
TOO_MANY = 4429
UNAVAILABLE = 4503

MAX_ARGS = 1000
MAX_ARGS_BYTES = 65536
MAX_SIZE = 1000


class TerminalRefused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StartRequest:
    """What the client asks for in its first message."""

    argv: list[str]
    pty: bool
    cols: int
    rows: int
    client: str
    # A terminal kept on the node under this name (tmux), reattached by the next with it.
    keep: str = ""
    # The folder it opens in ("": the login's own, the home).
    cwd: str = ""

    def command(self, worker_id: str) -> list[str]:
        """What runs in the job: the argv, or for a kept terminal the step that attaches it
        (with a folder, in a window of its own there if the kept terminal already runs)."""
        argv = self.argv
        if self.keep:
            argv = ["sh", "-c", KEPT_TERMINAL, "activate-terminal", self.keep, worker_id]
            argv += ["here"] if self.cwd else []
        return in_folder(self.cwd, argv)


def _size(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
        raise TerminalRefused(BAD_REQUEST, f"{name} must be a whole number from 1 to {MAX_SIZE}")
    return value


def parse_start(text: str) -> StartRequest:
    """The first message: {"type": "start", "command": [...], "pty": bool, "cols", "rows"}."""
    try:
        message = json.loads(text)
    except ValueError:
        raise TerminalRefused(BAD_REQUEST, "the first message must be JSON") from None
    if not isinstance(message, dict) or message.get("type") != "start":
        raise TerminalRefused(BAD_REQUEST, 'the first message must be {"type": "start", ...}')
    argv = message.get("command", [])
    if (
        not isinstance(argv, list)
        or not all(isinstance(arg, str) and "\x00" not in arg for arg in argv)
        or len(argv) > MAX_ARGS
        or sum(len(arg) for arg in argv) > MAX_ARGS_BYTES
    ):
        raise TerminalRefused(
            BAD_REQUEST, "command must be a list of at most 1000 strings without NULs"
        )
    pty = message.get("pty", not argv)
    if not isinstance(pty, bool):
        raise TerminalRefused(BAD_REQUEST, "pty must be true or false")
    keep = message.get("keep", "")
    if not isinstance(keep, str) or (keep and not KEEP_NAME.fullmatch(keep)):
        raise TerminalRefused(BAD_REQUEST, "keep must be 1-32 letters, digits, '-' or '_'")
    if keep and (argv or not pty):
        raise TerminalRefused(BAD_REQUEST, "keep is for an interactive shell (a pty, no command)")
    client = message.get("client", "")
    try:
        cwd = checked_folder(message.get("cwd", ""), "cwd")
    except ParameterError as exc:
        raise TerminalRefused(BAD_REQUEST, f"cwd {exc.message}") from None
    return StartRequest(
        argv=argv,
        pty=pty,
        cols=_size(message.get("cols", 80), "cols"),
        rows=_size(message.get("rows", 24), "rows"),
        client=client[:32] if isinstance(client, str) else "",
        keep=keep,
        cwd=cwd,
    )


def parse_resize(message: dict[str, Any]) -> tuple[int, int]:
    return _size(message.get("cols"), "cols"), _size(message.get("rows"), "rows")


def find_worker(user: AbstractBaseUser, public_id: str) -> Worker:
    """The user's own worker, or TerminalRefused(NOT_FOUND): staff included, nobody else's."""
    worker = (
        Worker.objects.select_related("cluster", "account", "account__cluster")
        .filter(public_id=public_id, owner_id=user.pk)
        .first()
    )
    if worker is None:
        raise TerminalRefused(NOT_FOUND, f"No worker {public_id}.")
    return worker


def record_opening(
    user: AbstractBaseUser, public_id: str, request: StartRequest
) -> tuple[TerminalRecord, Worker]:
    """The database half of opening a terminal: whose worker, its status, the cap, the record."""
    worker = find_worker(user, public_id)
    if worker.status != WorkerStatus.CONNECTED or not worker.scheduler_job_id:
        raise TerminalRefused(
            NOT_CONNECTED,
            f"Worker {worker.name} is {worker.status}: a terminal needs a connected worker.",
        )
    return _record_opening(user, worker, request), worker


def start_stream(worker: Worker, request: StartRequest) -> Stream:
    """The cluster half, with no database: a slow login host must not hold the thread that
    database calls of the server's other connections share."""
    pty = PtySize(cols=request.cols, rows=request.rows) if request.pty else None
    try:
        return open_stream(worker, request.command(worker.public_id), pty=pty)
    except (SSHError, SchedulerError, QueryFailed, ValueError) as exc:
        raise TerminalRefused(
            UNAVAILABLE, f"Cannot reach worker {worker.name} on {worker.cluster.name}: {exc}"
        ) from exc


def open_terminal(
    user: AbstractBaseUser, public_id: str, request: StartRequest
) -> tuple[TerminalRecord, Stream]:
    record, worker = record_opening(user, public_id, request)
    try:
        return record, start_stream(worker, request)
    except TerminalRefused as exc:
        close_terminal(record.pk, exit_status=None, reason=f"could not start: {exc.message}")
        raise


def _record_opening(
    user: AbstractBaseUser, worker: Worker, request: StartRequest
) -> TerminalRecord:
    # A record left open by a killed server stops counting once it is older than any terminal
    # may live, so the cap heals itself.
    since = timezone.now() - timedelta(seconds=settings.ACTIVATE_TERMINAL_MAX_DURATION + 60)
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        open_now = TerminalRecord.objects.filter(
            user_id=user.pk, closed_at__isnull=True, opened_at__gt=since
        ).count()
        if open_now >= settings.ACTIVATE_TERMINALS_PER_USER:
            raise TerminalRefused(
                TOO_MANY,
                f"You already have {open_now} terminals open "
                f"(at most {settings.ACTIVATE_TERMINALS_PER_USER}); close one first.",
            )
        return TerminalRecord.objects.create(
            worker=worker,
            worker_public_id=worker.public_id,
            user_id=user.pk,
            command=request.argv,
            pty=request.pty,
            keep=request.keep,
            client=request.client,
        )


def close_terminal(record_id: int, *, exit_status: int | None, reason: str) -> None:
    TerminalRecord.objects.filter(pk=record_id, closed_at__isnull=True).update(
        closed_at=timezone.now(), exit_status=exit_status, close_reason=reason[:255]
    )


log = logging.getLogger(__name__)
# The process serving an open terminal keeps this key alive; a record whose key is gone on two
# sweeps in a row lost its server (killed, or its host gone) and is closed with a reason, so it
# neither counts against its user's terminals nor keeps its worker from being idle. Two sweeps,
# because a Redis that restarted empty has lost every key until each server's next refresh.
ALIVE_KEY = "activate:terminal-alive:"
MISSING_KEY = "activate:terminals-missing"
ALIVE_FOR = 10.0
LOST_REASON = f"its web server was lost: no sign of it for {ALIVE_FOR:g} s"


def note_alive(record_id: int) -> None:
    """The terminal is still served by this process (called every ALIVE_FOR / 4 s)."""
    try:
        redis_client().set(f"{ALIVE_KEY}{record_id}", b"1", px=int(ALIVE_FOR * 1000))
    except RedisError as exc:
        log.warning("terminal %s: liveness not noted: %s", record_id, exc)


def close_lost_terminals(now: datetime | None = None) -> int:
    """Close open terminal records no process has served for ALIVE_FOR on two sweeps running."""
    now = now or timezone.now()
    ids = list(
        TerminalRecord.objects.filter(
            closed_at__isnull=True, opened_at__lt=now - timedelta(seconds=ALIVE_FOR)
        ).values_list("pk", flat=True)
    )
    client = redis_client()
    try:
        alive = client.mget([f"{ALIVE_KEY}{pk}" for pk in ids]) if ids else []
        missing = {pk for pk, value in zip(ids, alive, strict=True) if value is None}
        before = {int(member) for member in client.smembers(MISSING_KEY)}
        with client.pipeline() as pipe:
            pipe.delete(MISSING_KEY)
            if missing:
                pipe.sadd(MISSING_KEY, *missing)
            pipe.execute()
    except RedisError as exc:
        log.warning("lost terminals not swept, Redis did not answer: %s", exc)
        return 0
    lost = sorted(missing & before)
    for pk in lost:
        close_terminal(pk, exit_status=None, reason=LOST_REASON)
    return len(lost)

"""The session lifecycle: one function per status change, and nothing else writes a status.

Each change is a compare-and-set on the status that was read plus an event row, in one
transaction, exactly as workers' lifecycle does; the caller learns whether it won.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from sessions_app.models import Session, SessionEvent
from sessions_app.statuses import FINISHED, LIVE, SessionStatus, can_transition

S = SessionStatus
log = logging.getLogger(__name__)

REASON_STOPPED = "Stopped by user"
REASON_WORKER_DELETED = "Its worker was deleted"
REASON_DISCONNECTED = "Worker disconnected"

_MAX_RACE_RETRIES = 5


def _change(
    session: Session,
    new: SessionStatus,
    *,
    allowed_from: Iterable[SessionStatus],
    reason: str,
    fields: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    allowed = frozenset(allowed_from)
    now = now or timezone.now()
    for _ in range(_MAX_RACE_RETRIES):
        current = Session.objects.filter(pk=session.pk).values_list("status", flat=True).first()
        if current is None or current not in allowed or not can_transition(current, new):
            if current is not None:
                session.status = current
            return False
        values: dict[str, Any] = {"status": new, "status_reason": reason[:512], "updated_at": now}
        if new in FINISHED:
            values["ended_at"] = now
        values.update(fields or {})
        with transaction.atomic():
            if Session.objects.filter(pk=session.pk, status=current).update(**values) == 1:
                SessionEvent.objects.create(
                    session_id=session.pk,
                    old_status=current,
                    new_status=new,
                    reason=values["status_reason"],
                    at=now,
                )
                for name, value in values.items():
                    setattr(session, name, value)
                log.info("session %s: %s -> %s (%s)", session.public_id, current, new, reason)
                return True
    return False


def record_requested(session: Session) -> None:
    SessionEvent.objects.create(
        session_id=session.pk, old_status="", new_status=session.status, reason="Requested"
    )


def claim_start(session: Session) -> bool:
    """One caller wins the right to start the program."""
    return _change(session, S.STARTING, allowed_from=[S.PENDING], reason="")


def release_start(session: Session, *, reason: str) -> bool:
    """The start did not finish (its worker is not connected yet): try again later."""
    return _change(session, S.PENDING, allowed_from=[S.STARTING], reason=reason)


def mark_running(
    session: Session, *, node_host: str, node_port: int, node_pid: int, login_cookie: str = ""
) -> bool:
    fields: dict[str, Any] = {
        "node_host": node_host,
        "node_port": node_port,
        "node_pid": node_pid,
        "started_at": timezone.now(),
    }
    if login_cookie:
        fields["login_cookie_encrypted"] = Session.encrypt(login_cookie)
    return _change(session, S.RUNNING, allowed_from=[S.STARTING], reason="", fields=fields)


def end_session(session: Session, *, reason: str) -> bool:
    return _change(session, S.ENDED, allowed_from=LIVE, reason=reason)


def fail_session(session: Session, *, reason: str) -> bool:
    return _change(session, S.FAILED, allowed_from=LIVE, reason=reason)

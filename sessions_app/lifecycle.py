"""The session lifecycle: one function per status change, and nothing else writes a status.

Each change is a compare-and-set on the status that was read plus an event row, in one
transaction, through the state machine workers' lifecycle uses too; the caller learns whether
it won.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from core.statemachine import StateMachine
from sessions_app.models import Session, SessionEvent
from sessions_app.statuses import FINISHED, LIVE, TRANSITIONS, SessionStatus

S = SessionStatus

REASON_STOPPED = "Stopped by user"
REASON_WORKER_DELETED = "Its worker was deleted"
REASON_DISCONNECTED = "Worker disconnected"

_MACHINE = StateMachine(Session, SessionEvent, TRANSITIONS, FINISHED, finished_field="ended_at")


def record_requested(session: Session) -> None:
    SessionEvent.objects.create(
        session_id=session.pk, old_status="", new_status=session.status, reason="Requested"
    )


def claim_start(session: Session) -> bool:
    """One caller wins the right to start the program."""
    return _MACHINE.change(session, S.STARTING, allowed_from=[S.PENDING], reason="")


def release_start(session: Session, *, reason: str) -> bool:
    """The start did not finish (its worker is not connected yet): try again later."""
    return _MACHINE.change(session, S.PENDING, allowed_from=[S.STARTING], reason=reason)


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
    return _MACHINE.change(session, S.RUNNING, allowed_from=[S.STARTING], reason="", fields=fields)


def end_session(session: Session, *, reason: str) -> bool:
    return _MACHINE.change(session, S.ENDED, allowed_from=LIVE, reason=reason)


def fail_session(session: Session, *, reason: str) -> bool:
    return _MACHINE.change(session, S.FAILED, allowed_from=LIVE, reason=reason)

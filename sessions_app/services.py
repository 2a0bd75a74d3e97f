"""Session state changes caused by their worker's life. Only this module writes a session status."""

from __future__ import annotations

from django.utils import timezone

from sessions_app.models import Session, SessionStatus


def finish_sessions_of_worker(worker_id: int, *, reason: str, failed: bool) -> int:
    """End every running session on a worker; returns how many changed."""
    status = SessionStatus.FAILED if failed else SessionStatus.ENDED
    return Session.objects.filter(worker_id=worker_id, status=SessionStatus.RUNNING).update(
        status=status, status_reason=reason, ended_at=timezone.now()
    )


def delete_sessions_of_worker(worker_id: int) -> int:
    deleted, _ = Session.objects.filter(worker_id=worker_id).delete()
    return deleted

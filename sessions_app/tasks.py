"""Celery tasks: thin wrappers over ``sessions_app.services`` and ``sessions_app.idle``."""

from __future__ import annotations

from celery import Task, shared_task

from core import sweep_lag
from sessions_app import idle, services

# A pending session's worker may wait in the queue for long: back off to this many seconds.
MAX_RETRY_DELAY = 30
RETRY_START_AFTER = 3.0


@shared_task(bind=True, max_retries=None)
def start_session(self: Task, session_id: int) -> str:
    outcome = services.start_session(session_id)
    if outcome == "retrying":
        # Not at once: a dropped connection or a busy scheduler takes a moment to come back.
        raise self.retry(countdown=RETRY_START_AFTER)
    if outcome == "waiting":
        delay = min(MAX_RETRY_DELAY, 0.5 * 1.5 ** min(self.request.retries, 20))
        raise self.retry(countdown=delay)
    return outcome


@shared_task
def stop_program(session_id: int) -> None:
    services.stop_program(session_id)


@shared_task
def sweep_sessions() -> int:
    queued = services.sweep_sessions()
    sweep_lag.note_completed("sessions")
    return queued


@shared_task
def sweep_idle_sessions() -> dict[str, int]:
    done = idle.sweep_idle_sessions()
    sweep_lag.note_completed("idle_sessions")
    return done

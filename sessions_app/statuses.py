"""Session statuses and the transitions between them: the one table the lifecycle obeys."""

from __future__ import annotations

from django.db import models

from core import statemachine


class SessionStatus(models.TextChoices):
    # Requested; waits for its worker to be connected.
    PENDING = "pending", "pending"
    # Its program is being started on the worker's node.
    STARTING = "starting", "starting"
    # Its program answers on the node; the platform proxies to it.
    RUNNING = "running", "running"
    # Stopped by its user, or its worker or job ended.
    ENDED = "ended", "ended"
    # Could not start, or its worker failed or lost contact; the reason says which.
    FAILED = "failed", "failed"


S = SessionStatus

TRANSITIONS: dict[SessionStatus, frozenset[SessionStatus]] = {
    S.PENDING: frozenset({S.STARTING, S.ENDED, S.FAILED}),
    # Back to pending: the start was interrupted (its worker was requeued) and is tried again.
    S.STARTING: frozenset({S.PENDING, S.RUNNING, S.ENDED, S.FAILED}),
    S.RUNNING: frozenset({S.ENDED, S.FAILED}),
    S.ENDED: frozenset(),
    S.FAILED: frozenset(),
}

FINISHED = frozenset({S.ENDED, S.FAILED})
LIVE = frozenset(set(SessionStatus) - FINISHED)


def can_transition(old: SessionStatus | str, new: SessionStatus | str) -> bool:
    return statemachine.can_transition(TRANSITIONS, old, new)

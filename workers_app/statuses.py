"""Worker statuses and the transitions between them: the one table the lifecycle obeys."""

from __future__ import annotations

from django.db import models

from core import statemachine


class WorkerStatus(models.TextChoices):
    # Requested; not yet accepted by the scheduler (waits here while the cluster is unreachable).
    PENDING = "pending", "pending"
    # The scheduler accepted the job; it waits for a node.
    QUEUED = "queued", "queued"
    # The job runs on a node, but the node's agent has not called back yet.
    STARTING = "starting", "starting"
    # The agent called back and keeps heartbeating; sessions and terminals may use the worker.
    CONNECTED = "connected", "connected"
    # Deletion was asked for; waiting for the scheduler to confirm the job is gone.
    STOPPING = "stopping", "stopping"
    # The job ended or was canceled.
    STOPPED = "stopped", "stopped"
    # The job failed, timed out, or lost contact.
    ERROR = "error", "error"


S = WorkerStatus

TRANSITIONS: dict[WorkerStatus, frozenset[WorkerStatus]] = {
    S.PENDING: frozenset({S.QUEUED, S.STARTING, S.STOPPING, S.STOPPED, S.ERROR}),
    S.QUEUED: frozenset({S.STARTING, S.CONNECTED, S.STOPPING, S.STOPPED, S.ERROR}),
    S.STARTING: frozenset({S.QUEUED, S.CONNECTED, S.STOPPING, S.STOPPED, S.ERROR}),
    S.CONNECTED: frozenset({S.QUEUED, S.STOPPING, S.STOPPED, S.ERROR}),
    S.STOPPING: frozenset({S.STOPPED, S.ERROR}),
    S.STOPPED: frozenset(),
    S.ERROR: frozenset(),
}

FINISHED = frozenset({S.STOPPED, S.ERROR})
LIVE = frozenset(set(WorkerStatus) - FINISHED)
# Statuses in which a scheduler job may exist and must be watched.
WITH_JOB = frozenset({S.QUEUED, S.STARTING, S.CONNECTED, S.STOPPING})


def can_transition(old: WorkerStatus | str, new: WorkerStatus | str) -> bool:
    return statemachine.can_transition(TRANSITIONS, old, new)

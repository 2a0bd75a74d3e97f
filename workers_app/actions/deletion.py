"""Deleting a worker: its sessions go, its job is cancelled, its row stays for the history."""

from __future__ import annotations

from django.db import transaction

from workers_app import signals
from workers_app.actions import lifecycle
from workers_app.models import Worker


def delete_worker(worker: Worker, *, reason: str = lifecycle.REASON_DELETED) -> bool:
    """Delete a worker: its sessions go, its job is cancelled; the row stays for the history."""
    with transaction.atomic():
        signals.worker_deleted.send(sender=Worker, worker=worker)
        return lifecycle.request_stop(worker, reason=reason)

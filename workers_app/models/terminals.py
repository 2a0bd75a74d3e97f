"""Terminals opened on workers' nodes, kept for operators."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers_app.models.workers import Worker


class TerminalRecord(models.Model):
    """A terminal a user opened on a worker's node (browser or `pw ssh`): kept for operators."""

    worker = models.ForeignKey(
        Worker, on_delete=models.SET_NULL, null=True, blank=True, related_name="terminals"
    )
    # Kept when the worker row is gone: the record outlives the worker.
    worker_public_id = models.CharField(max_length=16)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="terminals"
    )
    # Empty for an interactive shell; the argv of `pw ssh WORKER -- CMD` otherwise.
    command = models.JSONField(default=list, blank=True)
    pty = models.BooleanField(default=True)
    # The name of a terminal kept on the node (a tmux session) that this one attached to.
    keep = models.CharField(max_length=32, blank=True)
    client = models.CharField(max_length=32, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    close_reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [
            models.Index(
                fields=["user", "opened_at"],
                condition=Q(closed_at__isnull=True),
                name="terminal_open_per_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.worker_public_id} ({self.opened_at:%Y-%m-%d %H:%M})"

    @property
    def duration(self) -> timedelta | None:
        return (self.closed_at - self.opened_at) if self.closed_at else None

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class SessionType(models.TextChoices):
    DESKTOP = "desktop", "Remote desktop"
    VSCODE = "vscode", "VS Code"


class SessionStatus(models.TextChoices):
    # The session's service is starting or serving on its worker.
    RUNNING = "running", "running"
    # The session ended normally (its worker was stopped or its job ended).
    ENDED = "ended", "ended"
    # The session failed; the reason says why (e.g. "Worker disconnected").
    FAILED = "failed", "failed"


class Session(models.Model):
    name = models.SlugField(max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="interactive_sessions"
    )
    session_type = models.CharField(max_length=16, choices=SessionType.choices)
    worker = models.ForeignKey(
        "workers_app.Worker", on_delete=models.CASCADE, related_name="sessions"
    )
    # A worker requested for this session alone; it ends when the session is deleted.
    dedicated_worker = models.BooleanField(default=False)
    status = models.CharField(
        max_length=16, choices=SessionStatus.choices, default=SessionStatus.RUNNING
    )
    status_reason = models.CharField(max_length=512, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["worker", "status"], name="session_worker_status")]

    def __str__(self) -> str:
        return self.name

"""What users are told about their workers, and what each chose to be told."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from workers_app.models import Worker


class NoticeKind(models.TextChoices):
    CONNECTED = "connected", "Worker connected"
    WALLTIME = "walltime", "Wall time running out"
    IDLE = "idle", "Idle: about to be deleted"


class Notice(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notices"
    )
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=16, choices=NoticeKind.choices)
    # What on the worker it is about when not the worker itself: a session's public id.
    subject = models.CharField(max_length=16, blank=True)
    title = models.CharField(max_length=200)
    body = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    emailed = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Each kind once per worker (and subject), however many sweeps or processes notice
            # it; an idle warning is removed when its clock is reset, so it can come again.
            models.UniqueConstraint(
                fields=["worker", "kind", "subject"], name="notice_once_per_subject"
            ),
        ]
        indexes = [models.Index(fields=["user", "id"], name="notice_user_id")]

    def __str__(self) -> str:
        return self.title


class NoticePrefs(models.Model):
    """Off switches, per kind and way; a user without a row gets every notice every way."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notice_prefs"
    )
    connected_page = models.BooleanField("Connected: on the page", default=True)
    connected_email = models.BooleanField("Connected: by e-mail", default=True)
    walltime_page = models.BooleanField("Wall time running out: on the page", default=True)
    walltime_email = models.BooleanField("Wall time running out: by e-mail", default=True)
    idle_page = models.BooleanField("Idle, about to be deleted: on the page", default=True)
    idle_email = models.BooleanField("Idle, about to be deleted: by e-mail", default=True)

    def __str__(self) -> str:
        return f"notices of {self.user}"

    def wants(self, kind: str, way: str) -> bool:
        return bool(getattr(self, f"{kind}_{way}"))

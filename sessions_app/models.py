from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.keystore import decrypt_private_key, encrypt_private_key
from sessions_app import kinds
from sessions_app.catalog.models import App, AppField
from sessions_app.statuses import SessionStatus
from workers_app.models.idle import IdlePolicy

__all__ = ["App", "AppField", "Session", "SessionEvent"]

PUBLIC_ID_ALPHABET = "abcdefghijkmnopqrstuvwxyz23456789"


def generate_public_id() -> str:
    return "s" + "".join(secrets.choice(PUBLIC_ID_ALPHABET) for _ in range(10))


class Session(IdlePolicy):
    public_id = models.CharField(max_length=16, unique=True, default=generate_public_id)
    name = models.CharField(max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="interactive_sessions"
    )
    # One of the registry's kinds (a callable: a new kind needs no migration).
    session_type = models.CharField(max_length=32, choices=kinds.choices)
    # What the owner gave an operator's app's fields (checked against them; defaults filled).
    values = models.JSONField(default=dict, blank=True)
    # The folder on the cluster its program opens in ("": the owner's home).
    folder = models.CharField(max_length=4096, blank=True)
    worker = models.ForeignKey(
        "workers_app.Worker", on_delete=models.CASCADE, related_name="sessions"
    )
    # A worker requested for this session alone; it ends when the session is deleted.
    dedicated_worker = models.BooleanField(default=False)
    status = models.CharField(
        max_length=16,
        choices=SessionStatus.choices,
        default=SessionStatus.PENDING,
        db_index=True,
    )
    status_reason = models.CharField(max_length=512, blank=True)
    # Where its program listens: the node (as the scheduler names it) and port.
    node_host = models.CharField(max_length=255, blank=True)
    node_port = models.PositiveIntegerField(null=True, blank=True)
    # The program's process on the node (its launcher), to stop it.
    node_pid = models.PositiveIntegerField(null=True, blank=True)
    # The program's own password, and what logging in with it gave (a cookie, a token), both
    # encrypted; the proxy fills them in, the user never types them.
    secret_encrypted = models.TextField(blank=True)
    login_cookie_encrypted = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["worker", "status"], name="session_worker_status"),
            models.Index(fields=["status", "updated_at"], name="session_status_updated"),
        ]

    def __str__(self) -> str:
        return self.name

    def secret(self) -> str:
        return decrypt_private_key(self.secret_encrypted) if self.secret_encrypted else ""

    def set_secret(self, value: str) -> None:
        self.secret_encrypted = self.encrypt(value)

    @staticmethod
    def encrypt(value: str) -> str:
        return encrypt_private_key(value)

    def login_cookie(self) -> str:
        if not self.login_cookie_encrypted:
            return ""
        return decrypt_private_key(self.login_cookie_encrypted)

    @property
    def badge(self) -> str:
        """The workers' pages' badge colour that says the same thing."""
        return {
            SessionStatus.RUNNING: "connected",
            SessionStatus.ENDED: "stopped",
            SessionStatus.FAILED: "error",
        }.get(SessionStatus(self.status), str(self.status))

    @property
    def url_path(self) -> str:
        """Where the browser reaches it through the platform's proxy."""
        return f"/s/{self.public_id}/"


class SessionEvent(models.Model):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    old_status = models.CharField(max_length=16)
    new_status = models.CharField(max_length=16)
    reason = models.CharField(max_length=512, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.old_status} -> {self.new_status}"

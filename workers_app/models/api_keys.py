"""API keys: shown once, kept as a hash."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from workers_app.models.identity import hash_secret


class KeyScope(models.TextChoices):
    FULL = "full", "everything the user may do"
    SESSION = "session", "everything but managing API keys"


class ApiKey(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=128, blank=True)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Keys the command line gets by signing in expire, and cannot make keys of their own.
    expires_at = models.DateTimeField(null=True, blank=True)
    scope = models.CharField(max_length=8, choices=KeyScope.choices, default=KeyScope.FULL)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def has_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @classmethod
    def issue(
        cls,
        user: models.Model,
        name: str = "",
        *,
        expires_at: datetime | None = None,
        scope: str = KeyScope.FULL,
    ) -> tuple[ApiKey, str]:
        """Create a key; the plain text is returned once and never stored."""
        secret = "pwk_" + secrets.token_urlsafe(32)
        key = cls.objects.create(
            user=user,
            name=name,
            prefix=secret[:12],
            key_hash=hash_secret(secret),
            expires_at=expires_at,
            scope=scope,
        )
        return key, secret

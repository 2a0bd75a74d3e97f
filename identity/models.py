"""Where each person's identity comes from, and the name the site knows them by."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Source(models.TextChoices):
    LOCAL = "local", "local password"
    OIDC = "oidc", "single sign-on (OpenID Connect)"
    LDAP = "ldap", "directory (LDAP)"


class Identity(models.Model):
    """How a user last signed in, and the name their site gives them (the claim or directory
    attribute the Unix names on clusters are made from)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identity"
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.LOCAL)
    # The provider's subject (OIDC "sub") or the directory entry's DN: stable across renames.
    subject = models.CharField(max_length=512, blank=True)
    site_name = models.CharField(
        max_length=255,
        blank=True,
        help_text="The name the site gives this person (OIDC preferred_username, LDAP uid); "
        "Unix names on clusters are made from it.",
    )
    groups = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(
                fields=["source", "subject"],
                condition=~models.Q(subject=""),
                name="identity_unique_subject",
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.get_source_display()})"

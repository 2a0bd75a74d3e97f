"""A user's named worker requests: an environment and its fields, requested again by name."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from workers_app.models.environments import Environment


class SavedRequest(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_requests"
    )
    name = models.SlugField(max_length=64)
    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="saved_requests"
    )
    # As validated when saved; requested again, they are validated again as the fields are then.
    params = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="saved_request_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

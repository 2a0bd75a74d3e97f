"""The idle policy a worker or session carries, and the site defaults operators set."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

IDLE_HELP = "Delete when idle this many minutes (blank: never)."


def idle_minutes_field(help_text: str = IDLE_HELP) -> models.FloatField:
    return models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0)], help_text=help_text
    )


class IdlePolicy(models.Model):
    """Delete (end) after ``idle_minutes`` quiet; owners are warned first and may Keep."""

    idle_minutes = idle_minutes_field()
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    # Keep resets the clock: nothing before this counts as idle.
    idle_kept_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

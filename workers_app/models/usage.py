"""Operators' caps on what a user may hold on a cluster."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from workers_app.models.clusters import Cluster


class UsageCap(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="usage_caps")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="usage_caps",
        help_text="Empty: every user of the cluster who has no cap of their own.",
    )
    max_workers = models.PositiveIntegerField(
        null=True, blank=True, help_text="Workers not finished at once (pending to stopping)."
    )
    max_node_hours_month = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Node-hours from connected to stopped in a calendar month (UTC).",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "user"], name="usage_cap_per_user_and_cluster"
            ),
            models.UniqueConstraint(
                fields=["cluster"], condition=Q(user=None), name="usage_cap_default_per_cluster"
            ),
        ]

    def __str__(self) -> str:
        who = self.user.get_username() if self.user else "everyone"
        return f"{who} on {self.cluster.name}"

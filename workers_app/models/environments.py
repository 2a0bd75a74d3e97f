"""Environments: a cluster's partition and the scheduling fields users may set."""

from __future__ import annotations

import re

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from workers_app.models.clusters import Cluster, may_see_all, user_groups
from workers_app.models.idle import idle_minutes_field


class EnvironmentSource(models.TextChoices):
    AUTO = "auto", "auto-detected"
    CUSTOM = "custom", "custom"


class EnvironmentQuerySet(models.QuerySet["Environment"]):
    def visible_to(self, user: AbstractBaseUser | AnonymousUser) -> EnvironmentQuerySet:
        """The environments ``user`` may see: on a cluster they see, limited to no group or
        to one of theirs (operators see all)."""
        if may_see_all(user):
            return self
        mine = Q(allowed_groups__isnull=True) | Q(allowed_groups__in=user_groups(user))
        allowed = Environment.objects.filter(mine, cluster__in=Cluster.objects.visible_to(user))
        return self.filter(pk__in=allowed.values("pk"))


class Environment(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="environments")
    name = models.SlugField(max_length=64)
    partition = models.CharField(max_length=128, blank=True)
    source = models.CharField(
        max_length=8, choices=EnvironmentSource.choices, default=EnvironmentSource.CUSTOM
    )
    is_active = models.BooleanField(default=True)
    nodes_total = models.PositiveIntegerField(null=True, blank=True)
    nodes_available = models.PositiveIntegerField(null=True, blank=True)
    nodes_updated_at = models.DateTimeField(null=True, blank=True)
    idle_minutes = idle_minutes_field(
        "Site default for its workers: delete when idle this many minutes (blank: the "
        "cluster's default)."
    )
    allowed_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="+",
        help_text="Only members of these groups see the environment (none: all who see the "
        "cluster).",
    )

    objects = EnvironmentQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"], name="environment_unique_per_cluster"
            )
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class FieldKind(models.TextChoices):
    VALUE = "value", "single value"
    DIRECTIVES = "directives", "raw scheduler directives, one per line"


class EnvironmentField(models.Model):
    """A scheduling field the user may set when requesting a worker from an environment."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="fields")
    name = models.CharField(max_length=64)
    label = models.CharField(max_length=128, blank=True)
    kind = models.CharField(max_length=16, choices=FieldKind.choices, default=FieldKind.VALUE)
    default = models.CharField(max_length=512, blank=True)
    required = models.BooleanField(default=False)
    pattern = models.CharField(
        max_length=512, blank=True, help_text="Regular expression the whole value must match."
    )
    example = models.CharField(
        max_length=128, blank=True, help_text="A valid value shown in errors, e.g. 04:00:00."
    )
    choices = models.JSONField(default=list, blank=True, help_text="Allowed values, if any.")
    directive = models.CharField(
        max_length=256,
        blank=True,
        help_text="The scheduler option this value becomes, with {value}, e.g. --time={value}.",
    )
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "name"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "name"], name="field_unique_per_env")
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        # Caught where the operator types it: a pattern that does not compile, or choices that
        # are not strings, would otherwise fail every user's request from this environment.
        errors: dict[str, str] = {}
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                errors["pattern"] = f"Not a valid regular expression: {exc}."
        if not isinstance(self.choices, list) or not all(
            isinstance(choice, str) for choice in self.choices
        ):
            errors["choices"] = 'Must be a JSON list of strings, e.g. ["normal", "debug"].'
        if errors:
            raise ValidationError(errors)

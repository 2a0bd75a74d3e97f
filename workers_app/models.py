from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers_app.keystore import decrypt_private_key, encrypt_private_key
from workers_app.statuses import FINISHED, LIVE, WorkerStatus

PUBLIC_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def generate_public_id() -> str:
    return "w" + "".join(secrets.choice(PUBLIC_ID_ALPHABET) for _ in range(10))


def job_name_prefix() -> str:
    return f"pw-worker-{settings.ACTIVATE_INSTALLATION_ID}-"


def job_name_for(public_id: str) -> str:
    return job_name_prefix() + public_id


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class SchedulerKind(models.TextChoices):
    SLURM = "slurm", "Slurm"
    PBS = "pbs", "PBS Pro"
    HOST = "host", "Plain host (no scheduler)"


class Reachability(models.TextChoices):
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"
    UNKNOWN = "unknown", "unknown"


class Cluster(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    host = models.CharField(max_length=255)
    port = models.PositiveIntegerField(default=22)
    username = models.CharField(max_length=64)
    private_key_encrypted = models.TextField(
        blank=True, help_text="Fernet-encrypted with a key derived from ACTIVATE_SECRET_KEY."
    )
    host_key = models.TextField(
        blank=True, help_text='Pinned host key, e.g. "ssh-ed25519 AAAA...". Required to connect.'
    )
    scheduler = models.CharField(max_length=16, choices=SchedulerKind.choices)
    reachability = models.CharField(
        max_length=16, choices=Reachability.choices, default=Reachability.UNKNOWN
    )
    last_contact_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_private_key(self, pem: str) -> None:
        self.private_key_encrypted = encrypt_private_key(pem)

    def private_key(self) -> str:
        return decrypt_private_key(self.private_key_encrypted) if self.private_key_encrypted else ""

    @property
    def has_private_key(self) -> bool:
        return bool(self.private_key_encrypted)


class EnvironmentSource(models.TextChoices):
    AUTO = "auto", "auto-detected"
    CUSTOM = "custom", "custom"


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


class WorkerQuerySet(models.QuerySet["Worker"]):
    def live(self) -> WorkerQuerySet:
        return self.filter(status__in=LIVE)

    def visible(self, now: datetime) -> WorkerQuerySet:
        """What lists show: live workers, and finished ones until they are purged from view."""
        cutoff = now - timedelta(seconds=settings.ACTIVATE_PURGE_AFTER)
        return self.filter(~Q(status__in=FINISHED) | Q(finished_at__gt=cutoff))

    def overdue(self, status: WorkerStatus, now: datetime) -> WorkerQuerySet:
        return self.filter(status=status, deadline_at__lte=now).order_by("deadline_at")

    def awaiting_dispatch(self, now: datetime) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.PENDING, next_attempt_at__lte=now)

    def awaiting_cancel(self) -> WorkerQuerySet:
        return self.filter(cancel_requested=True)


class Worker(models.Model):
    public_id = models.CharField(max_length=16, unique=True, default=generate_public_id)
    name = models.CharField(max_length=128)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workers"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="workers")
    environment = models.ForeignKey(
        Environment, on_delete=models.SET_NULL, null=True, blank=True, related_name="workers"
    )
    params = models.JSONField(default=dict, blank=True)

    status = models.CharField(
        max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.PENDING, db_index=True
    )
    status_reason = models.CharField(max_length=512, blank=True)
    scheduler_job_id = models.CharField(max_length=64, blank=True)
    node_hostname = models.CharField(max_length=255, blank=True)
    scheduler_state = models.CharField(max_length=64, blank=True)
    exit_code = models.CharField(max_length=32, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The moment the current status times out; one indexed column so a sweep is one query.
    deadline_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    # Submission retries: the dispatch sweep sends pending workers whose attempt is due.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    submit_attempts = models.PositiveIntegerField(default=0)
    # The job must be cancelled until the scheduler confirms it gone, whatever the status says.
    cancel_requested = models.BooleanField(default=False)

    agent_secret_hash = models.CharField(max_length=64, blank=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "deadline_at"], name="worker_status_deadline"),
            models.Index(fields=["status", "finished_at"], name="worker_status_finished"),
            models.Index(fields=["status", "next_attempt_at"], name="worker_status_attempt"),
            models.Index(fields=["cluster", "status"], name="worker_cluster_status"),
            models.Index(fields=["owner", "-created_at"], name="worker_owner_created"),
            models.Index(
                fields=["cancel_requested"],
                condition=Q(cancel_requested=True),
                name="worker_cancel_requested",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"

    @property
    def job_name(self) -> str:
        return job_name_for(self.public_id)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


class WorkerEvent(models.Model):
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="events")
    old_status = models.CharField(max_length=16, choices=WorkerStatus.choices, blank=True)
    new_status = models.CharField(max_length=16, choices=WorkerStatus.choices)
    reason = models.CharField(max_length=512, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.old_status or '-'} -> {self.new_status}"


class ApiKey(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=128, blank=True)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @classmethod
    def issue(cls, user: models.Model, name: str = "") -> tuple[ApiKey, str]:
        """Create a key; the plain text is returned once and never stored."""
        secret = "pwk_" + secrets.token_urlsafe(32)
        key = cls.objects.create(
            user=user, name=name, prefix=secret[:12], key_hash=hash_secret(secret)
        )
        return key, secret

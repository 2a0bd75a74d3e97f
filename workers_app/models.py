from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers_app.keystore import decrypt_private_key, encrypt_private_key
from workers_app.statuses import FINISHED, WITH_JOB, WorkerStatus

PUBLIC_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def generate_public_id() -> str:
    return "w" + "".join(secrets.choice(PUBLIC_ID_ALPHABET) for _ in range(10))


def job_name_prefix() -> str:
    return f"pw-worker-{settings.ACTIVATE_INSTALLATION_ID}-"


def job_name_for(public_id: str) -> str:
    return job_name_prefix() + public_id


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_agent_secret() -> tuple[str, str]:
    """A secret for one worker's job, and the hash the server keeps."""
    secret = secrets.token_urlsafe(32)
    return secret, hash_secret(secret)


class SchedulerKind(models.TextChoices):
    SLURM = "slurm", "Slurm"
    PBS = "pbs", "PBS Pro"
    HOST = "host", "Plain host (no scheduler)"


class Reachability(models.TextChoices):
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"
    # Reachable or not, the platform cannot use it as configured (e.g. a key it cannot decrypt).
    MISCONFIGURED = "misconfigured", "misconfigured"
    UNKNOWN = "unknown", "unknown"


class AgentRoute(models.TextChoices):
    # Agents call the platform's agents' server (ACTIVATE_AGENT_URL) from the compute node.
    DIRECT = "direct", "direct"
    # Compute nodes cannot reach the platform: agents call a relay on the login host, which
    # passes each connection back over the platform's own SSH connection (a remote forward).
    VIA_LOGIN_HOST = "via_login_host", "via login host"


class Cluster(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    host = models.CharField(max_length=255)
    port = models.PositiveIntegerField(default=22)
    # The cluster's own account: probes partitions and node counts, and nothing of a user's
    # unless the cluster is shared.
    username = models.CharField(max_length=64, blank=True)
    private_key_encrypted = models.TextField(
        blank=True, help_text="Fernet-encrypted with a key derived from ACTIVATE_SECRET_KEY."
    )
    shared = models.BooleanField(
        default=False,
        help_text="Every user acts as the cluster's own account (a one-person or one-lab "
        "installation). Otherwise each user needs a cluster account of their own.",
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
    agent_route = models.CharField(
        max_length=16,
        choices=AgentRoute.choices,
        default=AgentRoute.DIRECT,
        help_text="How agents on compute nodes reach the platform. Via login host: a relay "
        "there, over the cluster's own account's SSH connection (`run_relays` must run).",
    )
    relay_host = models.CharField(
        max_length=255,
        blank=True,
        help_text="Via login host only: the login host's address as compute nodes see it; the "
        "relay listens there. Empty: every interface, and agents get the login host's name.",
    )
    relay_port = models.PositiveIntegerField(
        default=0,
        help_text="Via login host only: the relay's port on the login host. 0: one is picked "
        "the first time and kept.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.agent_route == AgentRoute.VIA_LOGIN_HOST and not self.username:
            raise ValidationError(
                {"agent_route": "The relay runs as the cluster's own account: set one first."}
            )
        if self.relay_port > 65535:
            raise ValidationError({"relay_port": "A port is 1 to 65535 (0: picked once)."})

    def set_private_key(self, pem: str) -> None:
        self.private_key_encrypted = encrypt_private_key(pem)

    def private_key(self) -> str:
        return decrypt_private_key(self.private_key_encrypted) if self.private_key_encrypted else ""

    @property
    def has_private_key(self) -> bool:
        return bool(self.private_key_encrypted)


class RelayState(models.TextChoices):
    STARTING = "starting", "starting"  # a supervisor holds the lease and is setting it up
    UP = "up", "up"  # forward and relay answer; agents get through
    DOWN = "down", "down"  # lost (SSH dropped, relay died); being re-established
    STOPPED = "stopped", "stopped"  # not wanted any more (route switched back to direct)
    # Not stored: shown when no supervisor confirmed the state lately (run_relays not running).
    UNKNOWN = "unknown", "unknown (no run_relays confirms it)"


class AgentRelay(models.Model):
    """The relay of a cluster in via-login-host mode, as its supervisor last saw it."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="agent_relay")
    state = models.CharField(max_length=16, choices=RelayState.choices, default=RelayState.STARTING)
    # host:port job scripts give agents; kept across restarts so running agents keep their route.
    address = models.CharField(max_length=300, blank=True)
    # The login host's loopback port the SSH connection forwards (changes with each connection).
    forwarded_port = models.PositiveIntegerField(null=True, blank=True)
    holder = models.CharField(max_length=128, blank=True, help_text="run_relays process: host:pid")
    last_error = models.TextField(blank=True)
    up_since = models.DateTimeField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    # Times it was re-established after being lost.
    repairs = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name"]

    def __str__(self) -> str:
        return f"relay of {self.cluster.name}"

    def state_now(self, now: datetime) -> str:
        """The stored state, or unknown when no supervisor has confirmed it within its lease."""
        if self.state == RelayState.STOPPED:
            return self.state
        stale = now - timedelta(seconds=settings.ACTIVATE_RELAY_LEASE)
        if self.checked_at is None or self.checked_at < stale:
            return RelayState.UNKNOWN
        return self.state


class AccountOrigin(models.TextChoices):
    GENERATED = "generated", "key pair generated by the platform"
    UPLOADED = "uploaded", "private key supplied by the user"
    OPERATOR = "operator", "mapped by an operator"


class ClusterAccount(models.Model):
    """A user's own login on a cluster: everything their workers do there runs as it."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_accounts"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="accounts")
    remote_username = models.CharField(max_length=64)
    private_key_encrypted = models.TextField(
        help_text="Fernet-encrypted with a key derived from ACTIVATE_SECRET_KEY."
    )
    # The OpenSSH line to paste into ~/.ssh/authorized_keys (safe to show).
    public_key = models.TextField(blank=True)
    origin = models.CharField(max_length=16, choices=AccountOrigin.choices)
    verified_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "cluster"], name="account_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.remote_username}@{self.cluster.name}"

    def set_private_key(self, pem: str) -> None:
        self.private_key_encrypted = encrypt_private_key(pem)

    def private_key(self) -> str:
        return decrypt_private_key(self.private_key_encrypted)

    @property
    def is_verified(self) -> bool:
        return self.verified_at is not None


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


class WorkerQuerySet(models.QuerySet["Worker"]):
    def to_poll(self) -> WorkerQuerySet:
        """Workers whose job the scheduler must be asked about: live, or to be cancelled."""
        return self.filter(Q(status__in=WITH_JOB) | Q(cancel_requested=True))

    def visible(self, now: datetime) -> WorkerQuerySet:
        """What lists show: live workers, and finished ones until they are purged from view."""
        cutoff = now - timedelta(seconds=settings.ACTIVATE_PURGE_AFTER)
        return self.filter(~Q(status__in=FINISHED) | Q(finished_at__gt=cutoff))

    def overdue(self, status: WorkerStatus, now: datetime) -> WorkerQuerySet:
        return self.filter(status=status, deadline_at__lte=now).order_by("deadline_at")

    def awaiting_dispatch(self, now: datetime) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.PENDING, next_attempt_at__lte=now)


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
    # What will be submitted, fixed when the request was validated: later edits or deletion
    # of the environment do not change a worker's job.
    job_partition = models.CharField(max_length=128, blank=True)
    job_directives = models.JSONField(default=list, blank=True)
    # The user's own cluster account the job runs as; null on a shared cluster.
    account = models.ForeignKey(
        ClusterAccount, on_delete=models.PROTECT, null=True, blank=True, related_name="workers"
    )

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
    # Cancel attempts, one at a time: the poll tries again when the next one is due.
    cancel_attempts = models.PositiveIntegerField(default=0)
    next_cancel_at = models.DateTimeField(null=True, blank=True)

    agent_secret_hash = models.CharField(max_length=64, blank=True)
    # A client's Idempotency-Key: the same request sent again answers this worker, not a new one.
    idempotency_key = models.CharField(max_length=255, blank=True)

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
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="worker_idempotency_key_per_owner",
            )
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


class WorkerCommand(models.Model):
    """A command a user ran on a worker's node (pw ssh, the API's exec): kept for operators."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="commands")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="worker_commands"
    )
    command = models.JSONField(default=list)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    error = models.CharField(max_length=512, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return " ".join(str(arg) for arg in self.command)[:80]


class TerminalRecord(models.Model):
    """A terminal a user opened on a worker's node (browser or `pw ssh`): kept for operators."""

    worker = models.ForeignKey(
        Worker, on_delete=models.SET_NULL, null=True, blank=True, related_name="terminals"
    )
    # Kept when the worker row is gone: the record outlives the worker.
    worker_public_id = models.CharField(max_length=16)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="terminals"
    )
    # Empty for an interactive shell; the argv of `pw ssh WORKER -- CMD` otherwise.
    command = models.JSONField(default=list, blank=True)
    pty = models.BooleanField(default=True)
    client = models.CharField(max_length=32, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    close_reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [
            models.Index(
                fields=["user", "opened_at"],
                condition=Q(closed_at__isnull=True),
                name="terminal_open_per_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.worker_public_id} ({self.opened_at:%Y-%m-%d %H:%M})"

    @property
    def duration(self) -> timedelta | None:
        return (self.closed_at - self.opened_at) if self.closed_at else None


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

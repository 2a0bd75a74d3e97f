"""Workers, their status events, and the commands run on them."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers_app.models.clusters import Cluster, ClusterAccount
from workers_app.models.environments import Environment
from workers_app.models.identity import generate_public_id, job_name_for
from workers_app.models.idle import IdlePolicy
from workers_app.statuses import FINISHED, WITH_JOB, WorkerStatus


class WorkerQuerySet(models.QuerySet["Worker"]):
    def to_poll(self) -> WorkerQuerySet:
        """Workers whose job the scheduler must be asked about: live, or to be cancelled."""
        return self.filter(Q(status__in=WITH_JOB) | Q(cancel_requested=True))

    def visible(self, now: datetime) -> WorkerQuerySet:
        """What lists show: live workers, and finished ones until they are purged from view."""
        cutoff = now - timedelta(seconds=settings.ACTIVATE_PURGE_AFTER)
        return self.filter(~Q(status__in=FINISHED) | Q(finished_at__gt=cutoff))

    def visible_to(self, user: User, now: datetime | None = None) -> WorkerQuerySet:
        """What a user's lists show: their own (staff: everyone's), minus long-finished workers."""
        workers = self.visible(now or timezone.now())
        if not getattr(user, "is_staff", False):
            workers = workers.filter(owner=user)
        return workers

    def overdue(self, status: WorkerStatus, now: datetime) -> WorkerQuerySet:
        return self.filter(status=status, deadline_at__lte=now).order_by("deadline_at")

    def awaiting_dispatch(self, now: datetime) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.PENDING, next_attempt_at__lte=now)


class Worker(IdlePolicy):
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
    # Set when the job goes as a task of a job array ("NAME[INDEX]", schedulers.base.task_key):
    # its tasks share the array's name, so this is what the worker's job is found by.
    job_task = models.CharField(max_length=160, blank=True)
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
            # Staff lists everyone's, newest first: read in order, not sorted whole.
            models.Index(fields=["-created_at", "-id"], name="worker_created"),
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
    def job_key(self) -> str:
        """What the scheduler's listing names this worker's job by: its task of an array, or
        its own name."""
        return self.job_task or self.job_name

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

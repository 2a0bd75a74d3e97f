"""The rows a benchmark or drill runs against in its own database: the test cluster registered,
its two environments, a user; and the clean-up that leaves no worker and no job behind."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING

from harness.cluster import SshTarget

if TYPE_CHECKING:
    import httpx
    from django.contrib.auth.models import User

    from harness.platform import Platform
    from workers_app.models import Cluster, Environment, Worker

CLUSTER_NAME = "bench-slurm"
HELD_ENVIRONMENT = "held"
RUN_ENVIRONMENT = "run"
JOB_NAME_PREFIX = "pw-worker-"
# What keeps a "held" worker's job waiting: a start time days away (Reason=BeginTime). Not
# --hold, which is not among the options users may set.
HOLD_DIRECTIVE = "--begin=now+7days"


def job_name(public_id: str) -> str:
    """The scheduler job name of a worker of this run's installation."""
    from workers_app.models import job_name_for

    return job_name_for(public_id)


def job_keys(public_ids: Iterable[str]) -> dict[str, str]:
    """public id -> what the scheduler's listing (``SshTarget.jobs``) names the worker's job by,
    as its last submission committed it: its own name, or its task of a job array."""
    from workers_app.models import Worker, job_name_for

    wanted = set(public_ids)
    keys = {public_id: job_name_for(public_id) for public_id in wanted}
    for public_id, task in Worker.objects.filter(public_id__in=wanted, job_task__gt="").values_list(
        "public_id", "job_task"
    ):
        keys[public_id] = task
    return keys


def job_key(public_id: str) -> str:
    return job_keys([public_id])[public_id]


def run_id() -> str:
    """A short tag that names this run's objects apart from everyone else's."""
    return secrets.token_hex(3)


def register_cluster(
    target: SshTarget, name: str = CLUSTER_NAME, scheduler: str = "slurm"
) -> Cluster:
    from workers_app.models import Cluster, Reachability

    cluster = Cluster.objects.filter(name=name).first() or Cluster(name=name)
    cluster.host, cluster.port, cluster.username = target.host, target.port, target.user
    cluster.host_key, cluster.scheduler = target.host_key, scheduler
    # Everyone acts as the one cluster account: runs need no per-user accounts.
    cluster.shared = True
    cluster.reachability = Reachability.UNKNOWN
    cluster.set_private_key(target.private_key)
    cluster.save()
    return cluster


def ensure_environments(cluster: Cluster, partition: str) -> tuple[Environment, Environment]:
    """Two environments: "held" (jobs wait to start, so many do not swamp the node) and "run"."""
    from workers_app.models import Environment, EnvironmentField, FieldKind

    made = []
    for name, directives in ((HELD_ENVIRONMENT, HOLD_DIRECTIVE), (RUN_ENVIRONMENT, "")):
        env, _ = Environment.objects.update_or_create(
            cluster=cluster, name=name, defaults={"partition": partition, "is_active": True}
        )
        EnvironmentField.objects.update_or_create(
            environment=env,
            name="walltime",
            defaults={"directive": "--time={value}", "default": "00:10:00", "position": 0},
        )
        EnvironmentField.objects.update_or_create(
            environment=env,
            name="directives",
            defaults={"kind": FieldKind.DIRECTIVES, "default": directives, "position": 1},
        )
        made.append(env)
    return made[0], made[1]


def run_user(username: str = "bench") -> User:
    from django.contrib.auth.models import User

    user, _ = User.objects.get_or_create(username=username)
    return user


def all_workers() -> list[Worker]:
    from workers_app.models import Worker

    return list(Worker.objects.all().order_by("pk"))


def forget_workers() -> None:
    """Start from an empty worker table (the run's own database)."""
    from workers_app.models import Worker

    Worker.objects.all().delete()


def start_afresh(target: SshTarget) -> Cluster:
    """An empty worker table, and the test cluster registered with its two environments."""
    forget_workers()
    cluster = register_cluster(target)
    ensure_environments(cluster, target.partition)
    return cluster


def end_run(platform: Platform, target: SshTarget, names: Iterable[str]) -> None:
    """Stop the platform, cancel the run's jobs still there, forget its workers."""
    platform.stop_all()
    target.cancel_names(names)
    forget_workers()


def connected_worker_via_api(
    api: httpx.Client, names: list[str], *, timeout: float = 120
) -> Worker:
    """A worker of the run environment requested over the API as a user would, once its agent
    connected; its job name goes into ``names`` at once so the run's clean-up finds it."""
    from harness import HarnessError
    from harness.waiting import wait_for
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    answer = api.post(
        "/api/workers/", json={"cluster": CLUSTER_NAME, "environment": RUN_ENVIRONMENT}
    )
    if answer.status_code != 201:
        raise HarnessError(f"worker request answered {answer.status_code}: {answer.text}")
    worker = Worker.objects.get(public_id=answer.json()["id"])
    names.append(job_name(worker.public_id))

    def is_connected() -> bool:
        worker.refresh_from_db()
        if worker.status in {WorkerStatus.ERROR, WorkerStatus.STOPPED}:
            raise HarnessError(f"the worker ended: {worker.status_reason}")
        return worker.status == WorkerStatus.CONNECTED

    wait_for(is_connected, timeout=timeout)
    return worker

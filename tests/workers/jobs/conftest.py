from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import SshTarget
from tests.factories import UserFactory
from workers_app.actions import requests
from workers_app.models import Cluster, Environment, EnvironmentField, Worker, job_name_for


def sbatch_as(target: SshTarget, name: str, *, hold: bool = True) -> str:
    """Submit a job on the test cluster directly (not through the platform)."""
    args = ["runuser", "-u", target.user, "--", "sbatch", "--parsable", f"--job-name={name}"]
    args += ["--hold"] if hold else []
    args += [f"--partition={target.partition}", "--output=/dev/null", "--wrap=sleep 600"]
    result = subprocess.run(args, capture_output=True, text=True, check=True, timeout=30)
    return result.stdout.strip().split(";")[0]


def squeue_ids(target: SshTarget, name: str) -> list[str]:
    result = subprocess.run(
        ["squeue", "-h", "-u", target.user, f"--name={name}", "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.split()


@pytest.fixture
def environment(db: None, make_cluster, ssh_target: SshTarget) -> Iterator[Environment]:
    cluster: Cluster = make_cluster()
    env = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=env, name="walltime", directive="--time={value}", default="00:10:00"
    )
    EnvironmentField.objects.create(
        environment=env, name="directives", kind="directives", position=1
    )
    yield env
    names = [w.job_name for w in Worker.objects.all()]
    # A bulk's jobs are tasks of arrays named apart from their workers.
    names += {w.job_task.partition("[")[0] for w in Worker.objects.exclude(job_task="")}
    names += [job_name_for("wnotaworker"), "pw-worker-otherinst-wnotaworker", "someone-elses-job"]
    # scancel --name takes one name: the account's jobs are listed once and cancelled by id.
    wanted = set(names)
    listed = subprocess.run(
        ["squeue", "-h", "--array", "-u", ssh_target.user, "-o", "%i|%j"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    ids = [line.split("|")[0] for line in listed if line.partition("|")[2] in wanted]
    for start in range(0, len(ids), 200):
        subprocess.run(["scancel", *ids[start : start + 200]], timeout=60)


@pytest.fixture
def new_worker(environment: Environment):
    def make(**params: str) -> Worker:
        return requests.request_worker(
            owner=UserFactory(),
            cluster=environment.cluster.name,
            environment=environment.name,
            params=params,
        )

    return make

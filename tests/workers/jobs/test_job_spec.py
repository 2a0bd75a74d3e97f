"""A request fixes what will be submitted: editing or deleting the environment afterwards does
not change the job (on the real Slurm)."""

from __future__ import annotations

import subprocess

import pytest

from harness.cluster import SshTarget
from workers_app.actions import jobs
from workers_app.models import Environment, EnvironmentField, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.slurm


def job_fields(job_id: str) -> dict[str, str]:
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(word.split("=", 1) for word in shown.split() if "=" in word)


def requested(new_worker) -> Worker:
    worker: Worker = new_worker(walltime="00:07:00", directives="--comment=validated")
    assert worker.job_partition and worker.job_directives == [
        "--time=00:07:00",
        "--comment=validated",
    ]
    return worker


def submitted_job(worker: Worker) -> dict[str, str]:
    assert jobs.submit_worker(worker.pk).startswith("submitted")
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.QUEUED
    return job_fields(worker.scheduler_job_id)


def test_an_environment_edited_after_the_request_does_not_change_the_job(
    new_worker, environment: Environment, ssh_target: SshTarget
) -> None:
    worker = requested(new_worker)
    environment.partition = "no-such-partition"
    environment.save()
    EnvironmentField.objects.filter(environment=environment, name="walltime").update(
        directive="--time=99:00:00"
    )

    job = submitted_job(worker)

    assert (job["Partition"], job["TimeLimit"], job["Comment"]) == (
        ssh_target.partition,
        "00:07:00",
        "validated",
    )


def test_an_environment_deleted_after_the_request_does_not_change_the_job(
    new_worker, environment: Environment, ssh_target: SshTarget
) -> None:
    worker = requested(new_worker)
    environment.delete()
    worker.refresh_from_db()
    assert worker.environment is None

    job = submitted_job(worker)

    assert (job["Partition"], job["TimeLimit"]) == (ssh_target.partition, "00:07:00")

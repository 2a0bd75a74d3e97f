"""Jobs that will not die, and job ids of every form: bounded retries, nothing stops early."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from django.utils import timezone

from harness.cluster import SshTarget
from workers_app.actions import jobs, lifecycle
from workers_app.models import Worker, job_name_for
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


@pytest.fixture
def someone_elses_job(ssh_target: SshTarget) -> Iterator[str]:
    """A real pending job of another Unix user: the platform's account cannot cancel it."""
    name = sorted(ssh_target.accounts)[0]
    other = replace(ssh_target, user=name, key_path=ssh_target.accounts[name], accounts={})
    [job_id] = other.sbatch_locally(
        [
            f"sbatch --parsable --begin=now+3600 --job-name=stubborn-{uuid.uuid4().hex[:6]} "
            f"--partition={ssh_target.partition} --output=/dev/null --wrap='sleep 600'"
        ]
    )
    yield job_id
    subprocess.run(["scancel", job_id], check=False, timeout=30)


def test_a_job_that_will_not_die_gets_one_cancel_attempt_per_backoff_period(
    new_worker, someone_elses_job: str
) -> None:
    worker: Worker = new_worker()
    lifecycle.mark_submitted(worker, job_id=someone_elses_job)
    lifecycle.request_stop(worker)
    assert worker.status == S.STOPPING and worker.cancel_requested

    for _ in range(3):
        jobs.poll_cluster(worker.cluster_id)
    worker.refresh_from_db()
    assert worker.cancel_attempts == 1 and worker.next_cancel_at > timezone.now()
    assert worker.status == S.STOPPING  # still trying, never given up, never claimed done

    Worker.objects.filter(pk=worker.pk).update(next_cancel_at=timezone.now())
    jobs.poll_cluster(worker.cluster_id)
    jobs.poll_cluster(worker.cluster_id)
    worker.refresh_from_db()
    assert worker.cancel_attempts == 2


def test_reconcile_cancels_orphans_of_every_id_form_and_carries_on(
    environment, ssh_target: SshTarget
) -> None:
    orphan = job_name_for(f"wnot{uuid.uuid4().hex[:6]}")
    [array_id] = ssh_target.sbatch_locally(
        [
            f"sbatch --parsable --array=0-2 --begin=now+3600 --job-name={orphan} "
            f"--partition={ssh_target.partition} --output=/dev/null --wrap='sleep 600'"
        ]
    )
    [plain_id] = ssh_target.sbatch_locally(
        [
            f"sbatch --parsable --begin=now+3600 --job-name={orphan} "
            f"--partition={ssh_target.partition} --output=/dev/null --wrap='sleep 600'"
        ]
    )
    try:
        cancelled = jobs.reconcile_cluster(environment.cluster_id)
        # Two jobs share the orphan's name (a duplicate, e.g.): both go, not just one of them.
        # Listed by task (squeue --array): each task of the array goes.
        tasks = {f"{array_id}_{n}" for n in range(3)}
        assert plain_id in cancelled and tasks <= set(cancelled), cancelled
        assert orphan not in ssh_target.job_names()
    finally:
        ssh_target.cancel_ids([array_id, plain_id])

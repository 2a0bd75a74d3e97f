"""A neighbour (another Unix user on the cluster) who names a job like the owner's worker gets
nothing: after an unknown submit outcome the platform adopts only the owner's own job, or submits
anew, and never cancels either. Real Slurm, real SSH as the owner's account, real Unix users."""

from __future__ import annotations

import subprocess

import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from workers_app.actions import jobs, requests
from workers_app.models import Environment, Worker, new_agent_secret
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


def sbatch_held(unix_user: str, name: str, partition: str) -> str:
    """A held job submitted by ``unix_user`` itself, outside the platform: its id."""
    sbatch = ["sbatch", "--parsable", "--hold", f"--job-name={name}", f"--partition={partition}"]
    result = subprocess.run(
        ["runuser", "-u", unix_user, "--", *sbatch, "--output=/dev/null", "--wrap=sleep 600"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.strip().split(";")[0]


def live_jobs(name: str) -> dict[str, str]:
    """Every user's live jobs of this name: id -> Unix user."""
    result = subprocess.run(
        ["squeue", "--noheader", f"--name={name}", "--format=%i|%u"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return dict(line.split("|", 1) for line in result.stdout.split())


def job_user(job_id: str) -> str:
    result = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%u"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.strip()


def a_worker_whose_submit_outcome_is_unknown(user: User, environment: Environment) -> Worker:
    """A pending worker whose earlier attempt committed its secret, ran sbatch, and died before
    recording an answer: the next attempt looks its job up by name."""
    worker = requests.request_worker(
        owner=user, cluster=environment.cluster.name, environment=environment.name
    )
    _, secret_hash = new_agent_secret()
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=secret_hash)
    worker.refresh_from_db()
    return worker


def test_the_owners_own_job_is_adopted_and_the_neighbours_twin_is_left_alone(
    owners_environment: Environment,
    user: User,
    owner_and_neighbour: tuple[str, str],
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = owner_and_neighbour
    worker = a_worker_whose_submit_outcome_is_unknown(user, owners_environment)
    # Given the owner's lost attempt made a job, and a neighbour then made one of the same name
    # (a higher id: the one a look-up across all users would prefer).
    owners_job = sbatch_held(owner, worker.job_name, ssh_target.partition)
    neighbours_job = sbatch_held(neighbour, worker.job_name, ssh_target.partition)
    assert int(neighbours_job) > int(owners_job)

    # When the submission is retried, polled, and the orphan sweep runs.
    outcome = jobs.submit_worker(worker.pk)
    jobs.poll_cluster(owners_environment.cluster_id)
    cancelled = jobs.reconcile_cluster(owners_environment.cluster_id)

    # Then the owner's job is the worker's, and both jobs are still there, each its user's.
    worker.refresh_from_db()
    assert outcome == f"submitted as job {owners_job}"
    assert (worker.status, worker.scheduler_job_id) == (S.QUEUED, owners_job)
    # (Another test's cancelled job may still be listed, completing: only these two are judged.)
    assert not {owners_job, neighbours_job} & set(cancelled), cancelled
    assert live_jobs(worker.job_name) == {owners_job: owner, neighbours_job: neighbour}


def test_with_only_a_neighbours_job_of_that_name_the_owner_gets_a_job_of_their_own(
    owners_environment: Environment,
    user: User,
    owner_and_neighbour: tuple[str, str],
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = owner_and_neighbour
    worker = a_worker_whose_submit_outcome_is_unknown(user, owners_environment)
    # Given the owner's lost attempt made nothing, but a neighbour holds a job of that name.
    neighbours_job = sbatch_held(neighbour, worker.job_name, ssh_target.partition)

    # When the submission is retried and the orphan sweep runs.
    outcome = jobs.submit_worker(worker.pk)
    cancelled = jobs.reconcile_cluster(owners_environment.cluster_id)

    # Then the worker has a new job of the owner's, and the neighbour's is untouched.
    worker.refresh_from_db()
    assert outcome.startswith("submitted as job"), outcome
    assert worker.scheduler_job_id not in {"", neighbours_job}
    assert not worker.events.filter(reason__startswith="Found job").exists()
    assert not {worker.scheduler_job_id, neighbours_job} & set(cancelled), cancelled
    assert job_user(worker.scheduler_job_id) == owner
    assert live_jobs(worker.job_name)[neighbours_job] == neighbour

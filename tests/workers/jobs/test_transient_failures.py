"""Failures that pass are retried, failures no retry mends are said plainly, and neither shows
a user the cluster's host or account (on the real Slurm over real SSH)."""

from __future__ import annotations

import subprocess

import pytest
from django.utils import timezone

from harness.cluster import SshTarget
from workers_app.actions import jobs
from workers_app.models import Cluster, Reachability, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


def submit_now(worker: Worker) -> str:
    Worker.objects.filter(pk=worker.pk).update(next_attempt_at=timezone.now())
    outcome = jobs.submit_worker(worker.pk)
    worker.refresh_from_db()
    return outcome


@pytest.mark.serial
def test_a_scheduler_that_does_not_answer_keeps_the_worker_pending_until_it_does(
    new_worker, ssh_target: SshTarget
) -> None:
    worker: Worker = new_worker()
    subprocess.run(["bash", "scripts/testcluster.sh", "stop-slurmctld"], check=True, timeout=60)
    try:
        assert submit_now(worker).startswith("cluster unavailable")
        assert worker.status == S.PENDING
        assert worker.status_reason == (
            f"Waiting for cluster {worker.cluster.name}: "
            f"the scheduler on {worker.cluster.name} is not answering"
        )
    finally:
        subprocess.run(
            ["bash", "scripts/testcluster.sh", "start-slurmctld"], check=True, timeout=120
        )
    assert submit_now(worker).startswith("submitted")
    assert worker.status == S.QUEUED
    assert Worker.objects.filter(scheduler_job_id=worker.scheduler_job_id).count() == 1


def test_an_unreachable_cluster_is_named_to_users_without_its_host(
    new_worker, ssh_target: SshTarget
) -> None:
    worker: Worker = new_worker()
    Cluster.objects.filter(pk=worker.cluster_id).update(port=2299)

    submit_now(worker)

    assert worker.status == S.PENDING
    assert "cannot be reached" in worker.status_reason
    assert ssh_target.host not in worker.status_reason
    assert ssh_target.user not in worker.status_reason
    cluster = Cluster.objects.get(pk=worker.cluster_id)
    assert cluster.reachability == Reachability.OFFLINE and "refused" in cluster.last_error


def test_a_key_encrypted_under_another_secret_marks_the_cluster_misconfigured(
    new_worker, settings
) -> None:
    worker: Worker = new_worker()
    settings.SECRET_KEY = "a-rotated-secret-" + "x" * 40

    submit_now(worker)

    assert worker.status == S.PENDING
    assert "misconfigured" in worker.status_reason
    cluster = Cluster.objects.get(pk=worker.cluster_id)
    assert cluster.reachability == Reachability.MISCONFIGURED
    assert "ACTIVATE_SECRET_KEY" in cluster.last_error


def test_a_users_login_refused_fails_their_worker_and_asks_them_to_check_the_account(
    make_cluster, user, ssh_target: SshTarget
) -> None:
    from workers_app.actions import cluster_accounts as accounts
    from workers_app.actions import requests
    from workers_app.models import Environment

    cluster = make_cluster(name="per-user", shared=False)
    Environment.objects.create(cluster=cluster, name="compute", partition=ssh_target.partition)
    remote, key = sorted(ssh_target.accounts.items())[0]
    account = accounts.connect_account(
        user, cluster, remote_username=remote, private_key=open(key).read()
    )
    assert accounts.verify_account(account)
    worker = requests.request_worker(owner=user, cluster=cluster.name, environment="compute")
    # The user's key is no longer accepted there (removed from authorized_keys, say).
    account.set_private_key(accounts.generate_key_pair("not-installed")[0])
    account.save()

    submit_now(worker)

    assert worker.status == S.ERROR
    assert "refused your account's login" in worker.status_reason
    assert ssh_target.host not in worker.status_reason
    account.refresh_from_db()
    assert not account.is_verified and "authentication" in account.last_error

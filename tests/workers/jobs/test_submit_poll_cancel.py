"""Submission, polling and cancellation through the actions, against the real Slurm over SSH."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.db import connection
from django.utils import timezone

from core.transport.connection import commands_run_total
from schedulers import slurm
from schedulers.base import JobSpec, SchedulerError
from tests.conftest import SshTarget
from tests.workers.jobs.conftest import sbatch_as, squeue_ids
from workers_app.actions import clusters, jobs, lifecycle
from workers_app.models import Cluster, Reachability, Worker, hash_secret, job_name_for
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


def poll_until(worker: Worker, wanted: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs.poll_cluster(worker.cluster_id)
        worker.refresh_from_db()
        if worker.status in wanted:
            return
        time.sleep(1)
    pytest.fail(f"worker stayed {worker.status}: {worker.status_reason}")


def test_a_worker_is_submitted_then_seen_running_then_its_deletion_empties_squeue(
    new_worker,
    ssh_target: SshTarget,
) -> None:
    worker = new_worker()
    assert jobs.submit_worker(worker.pk).startswith("submitted as job")
    worker.refresh_from_db()
    assert worker.status == S.QUEUED and worker.scheduler_job_id
    assert squeue_ids(ssh_target, worker.job_name) == [worker.scheduler_job_id]
    poll_until(worker, {S.STARTING, S.CONNECTED})
    assert worker.node_hostname
    lifecycle.request_stop(worker)
    assert worker.status == S.STOPPING
    deadline = time.monotonic() + 60
    while jobs.cancel_worker_job(worker.pk) != "cancelled":
        assert time.monotonic() < deadline, "cancel never confirmed"
        Worker.objects.filter(pk=worker.pk).update(next_cancel_at=None)  # no backoff wait
        worker.refresh_from_db()
        time.sleep(1)
    worker.refresh_from_db()
    assert (worker.status, worker.cancel_requested) == (S.STOPPED, False)
    assert worker.status_reason == lifecycle.REASON_CANCELED
    assert squeue_ids(ssh_target, worker.job_name) == []


def test_a_job_created_by_an_earlier_attempt_is_adopted_not_duplicated(
    new_worker,
    ssh_target: SshTarget,
) -> None:
    worker = new_worker()
    # The earlier attempt wrote its secret, created the job, and died before recording it.
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash="0" * 64)
    earlier = sbatch_as(ssh_target, worker.job_name)
    result = jobs.submit_worker(worker.pk)
    worker.refresh_from_db()
    assert result == f"submitted as job {earlier}"
    assert worker.scheduler_job_id == earlier
    assert squeue_ids(ssh_target, worker.job_name) == [earlier]
    assert jobs.submit_worker(worker.pk) == "not pending"
    assert worker.events.filter(reason__startswith=f"Found job {earlier}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_first_attempt_runs_only_the_submit_command_and_a_retry_looks_first(
    new_worker,
    ssh_target: SshTarget,
) -> None:
    first, retried = new_worker(), new_worker()
    before = commands_run_total()
    assert jobs.submit_worker(first.pk).startswith("submitted as job")
    assert commands_run_total() - before == 1
    Worker.objects.filter(pk=retried.pk).update(agent_secret_hash="0" * 64)
    earlier = sbatch_as(ssh_target, retried.job_name)
    before = commands_run_total()
    assert jobs.submit_worker(retried.pk) == f"submitted as job {earlier}"
    assert commands_run_total() - before == 1  # the lookup found it: no second job
    assert squeue_ids(ssh_target, retried.job_name) == [earlier]


@pytest.mark.django_db(transaction=True)
def test_each_batch_command_runs_only_once_its_jobs_new_agent_secrets_are_committed(
    monkeypatch: pytest.MonkeyPatch, new_worker, ssh_target: SshTarget
) -> None:
    # Given 12 pending workers, submitted as arrays of at most 4, 3 at once
    monkeypatch.setattr(slurm, "ARRAY_TASKS", 4)
    monkeypatch.setattr(slurm, "ARRAY_PARALLEL", 3)
    workers = [new_worker(directives="--begin=now+7days") for _ in range(12)]
    by_name = {w.job_name: w.pk for w in workers}
    stored_at_start: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {}
    sending = slurm.SlurmAdapter._submit_array

    def noting_what_is_committed(
        adapter: slurm.SlurmAdapter, specs: list[JobSpec]
    ) -> list[str | SchedulerError]:
        # This thread's own database connection sees only what was committed.
        stored = {
            pk: (secret_hash, task)
            for pk, secret_hash, task in Worker.objects.filter(
                pk__in=[by_name[s.name] for s in specs]
            ).values_list("pk", "agent_secret_hash", "job_task")
        }
        connection.close()
        for s in specs:
            given = (hash_secret(s.environment["ACTIVATE_AGENT_KEY"]), s.key)
            stored_at_start[s.name] = (stored[by_name[s.name]], given)
        return sending(adapter, specs)

    monkeypatch.setattr(slurm.SlurmAdapter, "_submit_array", noting_what_is_committed)

    # When they are submitted together
    outcomes = jobs.submit_workers([w.pk for w in workers])

    # Then each array's command started with its jobs' new secrets' hashes and the keys they
    # are found by (their tasks) already committed
    assert all(o.startswith("submitted as job") for o in outcomes.values()), outcomes
    assert sorted(stored_at_start) == sorted(by_name)
    assert all(stored == given for stored, given in stored_at_start.values())
    assert len({given for _, given in stored_at_start.values()}) == 12
    assert len({given[1].split("[")[0] for _, given in stored_at_start.values()}) == 3


def test_with_200_live_workers_one_poll_runs_one_status_command(
    monkeypatch: pytest.MonkeyPatch,
    new_worker,
    environment,
    ssh_target: SshTarget,
) -> None:
    workers = [new_worker() for _ in range(200)]
    names = " ".join(w.job_name for w in workers)
    script = "for n in " + names + "; do sbatch --parsable --hold --output=/dev/null "
    script += f"--partition={ssh_target.partition} --job-name=$n --wrap='sleep 600'; done"
    out = subprocess.run(
        ["runuser", "-u", ssh_target.user, "--", "bash", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    for worker, job_id in zip(workers, out, strict=True):
        lifecycle.mark_submitted(worker, job_id=job_id.split(";")[0])
    jobs.poll_cluster(environment.cluster_id)  # opens the connection
    before = commands_run_total()
    assert jobs.poll_cluster(environment.cluster_id) == 200
    assert commands_run_total() - before == 1
    assert {Worker.objects.get(pk=w.pk).status for w in workers} == {S.QUEUED}
    # Past the id-list limit the poll lists the account's jobs instead: still one command,
    # and it still notices a job that ended.
    monkeypatch.setattr(slurm, "QUERY_CHUNK", 50)
    subprocess.run(["scancel", workers[0].scheduler_job_id], check=True, timeout=30)
    before = commands_run_total()
    jobs.poll_cluster(environment.cluster_id)
    assert commands_run_total() - before <= 2  # the listing, and the ended job's record
    first = Worker.objects.get(pk=workers[0].pk)
    assert first.status == S.STOPPED and "CANCELLED" in first.status_reason
    still = Worker.objects.filter(pk__in=[w.pk for w in workers[1:]], status=S.QUEUED)
    assert still.count() == 199
    before = commands_run_total()
    jobs.poll_cluster(environment.cluster_id)
    assert commands_run_total() - before == 1


@pytest.mark.serial
def test_a_failed_poll_changes_no_worker(
    new_worker,
    environment,
    ssh_target: SshTarget,
) -> None:
    worker = new_worker()
    jobs.submit_worker(worker.pk)
    events = worker.events.count()
    subprocess.run(["bash", "scripts/testcluster.sh", "stop-slurmctld"], check=True, timeout=60)
    try:
        # squeue gives up on the controller after some 9 s.
        assert jobs.poll_cluster(environment.cluster_id) == 0
        worker.refresh_from_db()
        assert worker.status == S.QUEUED
        assert worker.events.count() == events
    finally:
        subprocess.run(
            ["bash", "scripts/testcluster.sh", "start-slurmctld"], check=True, timeout=120
        )
    assert jobs.poll_cluster(environment.cluster_id) == 1


@pytest.mark.serial
def test_while_the_ssh_server_is_down_workers_stay_pending_then_are_sent_when_it_returns(
    new_worker, environment, ssh_target: SshTarget
) -> None:
    cluster: Cluster = environment.cluster
    assert clusters.probe_cluster(cluster.pk)
    subprocess.run(["bash", "scripts/testcluster.sh", "stop-sshd"], check=True, timeout=60)
    try:
        workers = [new_worker(), new_worker()]
        for worker in workers:
            assert jobs.submit_worker(worker.pk).startswith("cluster unavailable")
            worker.refresh_from_db()
            assert worker.status == S.PENDING
            assert worker.status_reason.startswith(f"Waiting for cluster {cluster.name}")
        cluster.refresh_from_db()
        assert cluster.reachability == Reachability.OFFLINE
        assert not clusters.probe_cluster(cluster.pk)
    finally:
        subprocess.run(["bash", "scripts/testcluster.sh", "start-sshd"], check=True, timeout=60)
    assert clusters.probe_cluster(cluster.pk)
    cluster.refresh_from_db()
    assert cluster.reachability == Reachability.ONLINE
    for worker in workers:
        worker.refresh_from_db()
        assert worker.next_attempt_at is not None and worker.next_attempt_at <= timezone.now()
        assert jobs.submit_worker(worker.pk).startswith("submitted")
        assert squeue_ids(ssh_target, worker.job_name) == [
            Worker.objects.get(pk=worker.pk).scheduler_job_id
        ]


def test_a_job_refused_by_the_scheduler_fails_the_worker_with_its_reason(
    new_worker,
    ssh_target: SshTarget,
) -> None:
    worker = new_worker(directives="--mem=99999999")
    assert jobs.submit_worker(worker.pk) == "refused"
    worker.refresh_from_db()
    assert worker.status == S.ERROR
    assert worker.status_reason.startswith("The scheduler refused the job: ")
    assert "node" in worker.status_reason.lower()
    assert squeue_ids(ssh_target, worker.job_name) == []


def test_a_job_that_ends_before_connecting_ends_the_worker_with_the_schedulers_reason(
    new_worker,
    ssh_target: SshTarget,
) -> None:
    worker = new_worker()
    jobs.submit_worker(worker.pk)
    worker.refresh_from_db()
    subprocess.run(["scancel", worker.scheduler_job_id], check=True, timeout=30)
    poll_until(worker, {S.STOPPED, S.ERROR})
    assert worker.status_reason.startswith("Job CANCELLED")


def test_reconcile_cancels_platform_jobs_that_belong_to_no_live_worker(
    new_worker,
    environment,
    ssh_target: SshTarget,
) -> None:
    live = new_worker()
    jobs.submit_worker(live.pk)
    orphan = sbatch_as(ssh_target, job_name_for("wnotaworker"))
    foreign = sbatch_as(ssh_target, "someone-elses-job")
    # Another installation sharing the account: its jobs are not ours to judge.
    other_installation = sbatch_as(ssh_target, "pw-worker-otherinst-wnotaworker")
    try:
        cancelled = jobs.reconcile_cluster(environment.cluster_id)
        assert orphan in cancelled
        assert foreign not in cancelled and live.scheduler_job_id not in cancelled
        assert other_installation not in cancelled
        live.refresh_from_db()
        assert squeue_ids(ssh_target, live.job_name) == [live.scheduler_job_id]
        assert foreign in squeue_ids(ssh_target, "someone-elses-job")
        assert other_installation in squeue_ids(ssh_target, "pw-worker-otherinst-wnotaworker")
        time.sleep(1)
        assert squeue_ids(ssh_target, job_name_for("wnotaworker")) == []
    finally:
        # Left alone by the platform, so the test ends them: later runs must not find them.
        subprocess.run(["scancel", foreign, other_installation], check=False, timeout=30)


def test_probe_detects_partitions_as_environments_with_node_counts(
    make_cluster,
    ssh_target: SshTarget,
) -> None:
    cluster = make_cluster(name="probed")
    assert clusters.probe_cluster(cluster.pk)
    env = cluster.environments.get(name=ssh_target.partition)
    assert env.source == "auto" and env.nodes_total == 1
    assert {f.name for f in env.fields.all()} == {
        "walltime",
        "numNodes",
        "account",
        "qos",
        "directives",
    }


def test_a_command_runs_on_a_connected_workers_node_inside_its_job(
    new_worker, ssh_target: SshTarget
) -> None:
    import socket

    from workers_app.actions import commands

    worker = new_worker()
    owner = worker.owner
    with pytest.raises(commands.WorkerNotReady):
        commands.run_on_worker(worker, ["hostname"], user=owner)
    jobs.submit_worker(worker.pk)
    poll_until(worker, {S.STARTING})
    lifecycle.mark_connected(worker, hostname="a-node-the-agent-made-up")
    result = commands.run_on_worker(
        worker, ["sh", "-c", 'echo "$SLURM_JOB_ID on $(hostname)"'], user=owner
    )
    assert result.exit_status == 0
    assert result.stdout.strip() == f"{worker.scheduler_job_id} on {socket.gethostname()}"
    hostile = commands.run_on_worker(worker, ["echo", "$(id); `id`; a'b"], user=owner)
    assert hostile.stdout.strip() == "$(id); `id`; a'b"
    recorded = list(worker.commands.order_by("started_at").values_list("command", "exit_status"))
    assert recorded == [
        (["sh", "-c", 'echo "$SLURM_JOB_ID on $(hostname)"'], 0),
        (["echo", "$(id); `id`; a'b"], 0),
    ]

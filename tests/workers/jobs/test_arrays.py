"""A bulk's jobs as tasks of Slurm job arrays, through the actions against the real Slurm over
SSH: each worker's job is found again by its task after a submitter died, and reconcile tells a
task some worker claims from one nobody does."""

from __future__ import annotations

import subprocess

import pytest

from schedulers import slurm
from tests.conftest import SshTarget
from workers_app.actions import jobs
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.slurm


def listed_tasks(target: SshTarget, array: str) -> list[str]:
    result = subprocess.run(
        ["squeue", "-h", "--array", "-u", target.user, f"--name={array}", "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return sorted(result.stdout.split())


@pytest.fixture(autouse=True)
def one_array(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "ARRAY_PARALLEL", 1)


def test_a_bulks_tasks_are_adopted_by_their_keys_after_the_submitter_died(
    new_worker, ssh_target: SshTarget
) -> None:
    # Given three workers submitted together: one array, each worker its task
    workers = [new_worker(directives="--begin=now+7days") for _ in range(3)]
    outcomes = jobs.submit_workers([w.pk for w in workers])
    assert all(o.startswith("submitted as job") for o in outcomes.values()), outcomes
    rows = list(Worker.objects.filter(pk__in=[w.pk for w in workers]).order_by("pk"))
    made = [w.scheduler_job_id for w in rows]
    array = rows[0].job_task.partition("[")[0]
    assert [w.job_task for w in rows] == [f"{array}[{n}]" for n in range(3)]
    assert listed_tasks(ssh_target, array) == sorted(made)
    assert len({job_id.split("_")[0] for job_id in made}) == 1
    # When the submitter had died before recording them (keys committed, jobs made)
    Worker.objects.filter(pk__in=[w.pk for w in rows]).update(status=S.PENDING, scheduler_job_id="")
    again = jobs.submit_workers([w.pk for w in rows])
    # Then the retry finds each worker's task and makes no job
    assert [again[w.pk] for w in rows] == [f"submitted as job {job_id}" for job_id in made]
    assert listed_tasks(ssh_target, array) == sorted(made)
    assert all(w.events.filter(reason__startswith="Found job").exists() for w in rows)


def test_reconcile_keeps_each_claimed_task_and_cancels_one_nobody_claims(
    new_worker, ssh_target: SshTarget
) -> None:
    # Given a bulk of three in one array, and then the second worker re-keyed elsewhere (as a
    # retry that did not find its task would): that task is claimed by nobody
    workers = [new_worker(directives="--begin=now+7days") for _ in range(3)]
    jobs.submit_workers([w.pk for w in workers])
    rows = list(Worker.objects.filter(pk__in=[w.pk for w in workers]).order_by("pk"))
    array = rows[0].job_task.partition("[")[0]
    Worker.objects.filter(pk=rows[1].pk).update(job_task=f"{array}-elsewhere[0]")
    # When the cluster is reconciled
    orphans = jobs.reconcile_cluster(rows[0].cluster_id)
    # Then of the three, only the unclaimed task was cancelled
    made = [w.scheduler_job_id for w in rows]
    assert [job_id in orphans for job_id in made] == [False, True, False]
    assert listed_tasks(ssh_target, array) == sorted(
        [rows[0].scheduler_job_id, rows[2].scheduler_job_id]
    )

"""The agent's key, given once in the owner's job, reaches no neighbour: another ordinary Unix
user on the same node and login host (the test cluster's second account, through `runuser`,
never root) finds it in no process, no scheduler answer and no file they can read. Slurm and the
OS refuse, not the platform's code. Real Slurm over real SSH as the owner's own account."""

from __future__ import annotations

import subprocess

import pytest
from django.contrib.auth.models import User

from harness.agents import agent_environ, agent_pids
from harness.waiting import wait_for
from tests.e2e.test_neighbour_adoption import job_user
from workers_app.actions import jobs, requests
from workers_app.models import Environment, Worker

pytestmark = pytest.mark.slurm
# Where anything of a job could be left on a node or login host, as the neighbour looks.
SEARCHED = ["/tmp", "/var/tmp", "/dev/shm", "/run", "/var/spool", "/var/lib/slurm", "/home"]


def run_as(
    user: str, *argv: str, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


@pytest.fixture(params=["alone", "in a bulk"])
def running_worker(
    request: pytest.FixtureRequest, owners_environment: Environment, user: User
) -> Worker:
    """A worker of the owner's own account whose job runs, its agent started on the node.
    Alone, its key is in its job's script (on sbatch's stdin, never in a file or a command
    line); in a bulk its job is a task of an array, and its key in a 0600 file of the owner's
    that the task reads and removes as it starts."""
    count = 1 if request.param == "alone" else 2
    worker, *others = (
        requests.request_worker(
            owner=user, cluster=owners_environment.cluster.name, environment=owners_environment.name
        )
        for _ in range(count)
    )
    outcomes = jobs.submit_workers([worker.pk, *(other.pk for other in others)])
    assert all(o.startswith("submitted as job") for o in outcomes.values()), outcomes
    worker.refresh_from_db()
    assert bool(worker.job_task) == bool(others)
    wait_for(lambda: agent_pids(worker.public_id), timeout=90)
    return worker


def test_the_agents_key_is_in_nothing_a_neighbour_can_read(
    running_worker: Worker, owner_and_neighbour: tuple[str, str]
) -> None:
    owner, neighbour = owner_and_neighbour
    job_id = running_worker.scheduler_job_id
    assert job_user(job_id) == owner
    # Read as root, the way only root and the owner can: the key the job was given.
    secret = agent_environ(running_worker.public_id, "ACTIVATE_AGENT_KEY")
    assert len(secret) >= 32
    [pid, *_] = agent_pids(running_worker.public_id)

    # The agent's environment: the kernel refuses the neighbour.
    environ = run_as(neighbour, "cat", f"/proc/{pid}/environ")
    assert environ.returncode != 0 and "Permission denied" in environ.stderr
    assert secret not in environ.stdout
    # Every process's command line on the node: the key was never an argument.
    listing = run_as(neighbour, "ps", "-eo", "user,pid,args", "--width", "100000")
    assert listing.returncode == 0 and f"{pid}" in listing.stdout
    assert secret not in listing.stdout
    # The job's script, which holds the key of a job alone: Slurm gives it to its owner only.
    script = run_as(neighbour, "scontrol", "write", "batch_script", job_id, "-")
    # (Slurm 22.05's scontrol exits 0 on this refusal: its words and the empty output tell.)
    assert script.stdout == "" and "retrieval failed" in script.stderr, script
    assert secret not in script.stderr
    owners_script = run_as(owner, "scontrol", "write", "batch_script", job_id, "-")
    assert owners_script.returncode == 0
    assert (secret in owners_script.stdout) is not bool(running_worker.job_task)
    # What Slurm tells anyone about the job, in full detail.
    shown = run_as(neighbour, "scontrol", "show", "job", "-dd", job_id)
    array, _, task = job_id.partition("_")
    names = f"ArrayJobId={array} ArrayTaskId={task}" if task else f"JobId={job_id}"
    assert shown.returncode == 0 and names in shown.stdout
    assert secret not in shown.stdout
    # Every file the neighbour can open where a job's traces could lie.
    # The same search as root finds the key where Slurm keeps the job's script: the places are
    # the right ones, and only permissions keep the neighbour out.
    # (The key goes to grep on stdin: on its command line the neighbour's watcher would see it.)
    found = subprocess.run(
        ["grep", "-rlsF", "-f", "-", "--", *SEARCHED],
        input=secret + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if running_worker.job_task:
        # A task's key waited in a file of the owner's that the task removed as it started
        # (tests/schedulers/test_slurm_arrays.py: refused to the neighbour while it waits).
        assert not found.stdout.strip(), found.stdout
    else:
        assert found.stdout.strip(), "the search finds no copy of the key even as root"
    searched = run_as(
        neighbour, "grep", "-rlsF", "-f", "-", "--", *SEARCHED, stdin=secret + "\n", timeout=120
    )
    assert searched.stdout == "", searched.stdout

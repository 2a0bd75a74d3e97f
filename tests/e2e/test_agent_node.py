"""The node a worker is on is the one its scheduler reports, not the one its agent names: on the
real Slurm over real SSH, with the agents' connect called as its view calls it.

Sessions and terminals connect to ``Worker.node_hostname`` with the owner's credentials; a
caller holding the worker's secret must not be able to point them elsewhere.
"""

from __future__ import annotations

import inspect
import subprocess
import time
from collections.abc import Iterator

import pytest

from agents import service as agent_service
from agents.service import AgentRefused
from harness.cluster import SshTarget
from schedulers.base import Phase
from tests.factories import UserFactory
from workers_app.actions import jobs, requests
from workers_app.cluster_access import adapter_for_worker
from workers_app.models import Environment, EnvironmentField, Worker, hash_secret
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm]
SECRET = "a-secret-the-test-gives-the-worker"


@pytest.fixture
def environment(db: None, make_cluster, ssh_target: SshTarget) -> Iterator[Environment]:
    cluster = make_cluster()
    environment = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    EnvironmentField.objects.create(
        environment=environment, name="directives", kind="directives", position=1
    )
    yield environment
    names = ",".join(w.job_name for w in Worker.objects.all())
    if names:
        subprocess.run(["scancel", "-u", ssh_target.user, f"--name={names}"], timeout=60)


def submitted(environment: Environment, **params: str) -> Worker:
    """A worker whose job the platform submitted, not yet polled, holding ``SECRET``."""
    worker = requests.request_worker(
        owner=UserFactory(),
        cluster=environment.cluster.name,
        environment=environment.name,
        params=params,
    )
    jobs.submit_worker(worker.pk)
    worker.refresh_from_db()
    assert worker.status == S.QUEUED and worker.scheduler_job_id
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=hash_secret(SECRET))
    worker.refresh_from_db()
    return worker


def scheduler_says(worker: Worker, phase: Phase, timeout: float = 60) -> str:
    """Waits until Slurm shows the job in ``phase``; its node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = (
            adapter_for_worker(worker).query([worker.scheduler_job_id]).get(worker.scheduler_job_id)
        )
        if info is not None and info.phase is phase:
            return info.node
        time.sleep(0.5)
    pytest.fail(f"job {worker.scheduler_job_id} never showed {phase}")


def connect(worker: Worker, *, hostname: str) -> float:
    """The agents' connect, past authentication: it takes the worker's secret, or with signed
    agents the hash of its key, whichever the service in this tree takes."""
    takes_hash = "key_hash" in inspect.signature(agent_service.connect_agent).parameters
    credential = hash_secret(SECRET) if takes_hash else SECRET
    return agent_service.connect_agent(
        worker.public_id, credential, hostname=hostname, job_id=worker.scheduler_job_id
    )


def test_an_agent_naming_another_host_connects_its_worker_on_the_schedulers_node(
    environment: Environment,
) -> None:
    worker = submitted(environment)
    node = scheduler_says(worker, Phase.RUNNING)
    assert node

    # Before any poll saw the job running, a caller with the secret names another host.
    connect(worker, hostname="elsewhere.example")

    worker.refresh_from_db()
    assert worker.status == S.CONNECTED
    assert worker.node_hostname == node
    noted = [event.reason for event in worker.events.all()]
    assert any("elsewhere.example" in reason and node in reason for reason in noted), noted


def test_an_agent_whose_job_the_scheduler_does_not_show_running_is_told_to_retry(
    environment: Environment,
) -> None:
    worker = submitted(environment, directives="--begin=now+1hour")
    scheduler_says(worker, Phase.QUEUED)

    with pytest.raises(AgentRefused) as refused:
        connect(worker, hostname="elsewhere.example")

    assert refused.value.status == 409
    worker.refresh_from_db()
    assert worker.status == S.QUEUED and worker.node_hostname == ""

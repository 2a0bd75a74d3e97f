from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from harness import cells
from harness.cluster import SshTarget
from harness.platform import Platform
from schedulers import adapter_class
from tests.platforms import module_platform
from workers_app.actions import cluster_accounts as accounts
from workers_app.models import ApiKey, Cluster, Environment, EnvironmentField, Worker

shared_platform = module_platform()


@pytest.fixture
def platform(transactional_db: None, shared_platform: Platform) -> Platform:
    """The module's platform (tests/platforms.py), the test's rows its own."""
    return shared_platform


# Tests that prove what every scheduler must do take the ``cell`` fixture and this mark.
on_every_scheduler = pytest.mark.parametrize("cell_kind", cells.KINDS)


def compute_environment(
    cluster: Cluster, cell: cells.Cell, walltime: str = "00:10:00"
) -> Environment:
    """The "compute" environment of a cluster: the cell's queue, a wall time of its own syntax."""
    environment = Environment.objects.create(cluster=cluster, name="compute", partition=cell.queue)
    EnvironmentField.objects.create(
        environment=environment,
        name="walltime",
        directive=adapter_class(cell.kind).field_syntax["walltime"].directive,
        pattern=r"\d{1,2}:\d{2}:\d{2}",
        default=walltime,
    )
    return environment


@pytest.fixture
def environment(transactional_db: None, make_cluster, cell: cells.Cell) -> Environment:
    """A shared cluster's environment on the test's scheduler."""
    return compute_environment(make_cluster(name=f"test-{cell.kind}", scheduler=cell.kind), cell)


@pytest.fixture
def slurm_environment(environment: Environment) -> Environment:
    return environment


@pytest.fixture
def owner_and_neighbour(ssh_target: SshTarget) -> tuple[str, str]:
    owner, neighbour = sorted(ssh_target.accounts)
    return owner, neighbour


@pytest.fixture
def owners_environment(
    db: None, make_cluster, ssh_target: SshTarget, user: User, owner_and_neighbour: tuple[str, str]
) -> Iterator[Environment]:
    """A per-user cluster where ``user`` acts as the owner's own verified account; the jobs of
    its workers are cancelled afterwards."""
    cluster = make_cluster(name="per-user", shared=False)
    environment = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    owner = owner_and_neighbour[0]
    key = Path(ssh_target.accounts[owner]).read_text()
    account = accounts.connect_account(user, cluster, remote_username=owner, private_key=key)
    assert accounts.verify_account(account), account.last_error
    yield environment
    # By id: scancel --name takes one name, and a bulk's tasks carry their array's.
    ids = list(
        Worker.objects.exclude(scheduler_job_id="").values_list("scheduler_job_id", flat=True)
    )
    if ids:
        subprocess.run(["scancel", *ids], check=False, timeout=60)


PW = Path(sys.executable).with_name("pw")


def pw_runner(
    platform: Platform, user: User, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real `pw` as ``user`` (a fresh API key) against the live platform."""
    _, key = ApiKey.issue(user)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PW_PLATFORM_HOST": platform.url,
        "PW_API_KEY": key,
        "PW_POLL_INTERVAL": "0.5",
    }

    def pw(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PW), *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    return pw

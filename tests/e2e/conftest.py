from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import SshTarget
from harness.platform import Platform
from workers_app.models import Cluster, Environment, EnvironmentField


@pytest.fixture
def platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    running = Platform(workdir=tmp_path)
    running.start_all()
    try:
        yield running
    finally:
        running.stop_all()


@pytest.fixture
def slurm_environment(transactional_db: None, make_cluster, ssh_target: SshTarget) -> Environment:
    cluster: Cluster = make_cluster()
    environment = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment,
        name="walltime",
        directive="--time={value}",
        pattern=r"\d{1,2}:\d{2}:\d{2}",
        default="00:10:00",
    )
    return environment

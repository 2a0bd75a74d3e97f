from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser

from workers_app.heartbeats import redis_client
from workers_app.models import Cluster

REPO = Path(__file__).resolve().parent.parent
CLUSTER_ENV = REPO / ".cluster" / "cluster.env"


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str
    key_path: str
    host_key: str
    partition: str

    @property
    def private_key(self) -> str:
        return Path(self.key_path).read_text()


def _read_cluster_env() -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if k.startswith("ACTIVATE_TEST_")}
    if CLUSTER_ENV.exists():
        for line in CLUSTER_ENV.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values.setdefault(key.strip(), value.strip())
    return values


@pytest.fixture(scope="session")
def ssh_target() -> SshTarget:
    """The real Slurm cluster over real SSH that scripts/testcluster.sh starts."""
    values = _read_cluster_env()
    if "ACTIVATE_TEST_SSH_HOST" not in values:
        pytest.fail("no test cluster: run `scripts/testcluster.sh up` (make test does)")
    return SshTarget(
        host=values["ACTIVATE_TEST_SSH_HOST"],
        port=int(values["ACTIVATE_TEST_SSH_PORT"]),
        user=values["ACTIVATE_TEST_SSH_USER"],
        key_path=values["ACTIVATE_TEST_SSH_KEY"],
        host_key=values["ACTIVATE_TEST_SSH_HOST_KEY"],
        partition=values.get("ACTIVATE_TEST_SLURM_PARTITION", "debug"),
    )


@pytest.fixture
def make_cluster(db: None, ssh_target: SshTarget):
    def make(name: str = "test-slurm", scheduler: str = "slurm", **overrides: object) -> Cluster:
        cluster = Cluster(
            name=name,
            host=ssh_target.host,
            port=ssh_target.port,
            username=ssh_target.user,
            host_key=ssh_target.host_key,
            scheduler=scheduler,
        )
        cluster.set_private_key(ssh_target.private_key)
        for key, value in overrides.items():
            setattr(cluster, key, value)
        cluster.save()
        return cluster

    return make


@pytest.fixture
def user(db: None) -> AbstractUser:
    return get_user_model().objects.create_user("alice", password="pw-alice-123")  # type: ignore[return-value]


@pytest.fixture
def other_user(db: None) -> AbstractUser:
    return get_user_model().objects.create_user("bob", password="pw-bob-123")  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Each test starts with an empty Redis database of its own (REDIS_URL picks the number)."""
    client = redis_client()
    client.flushdb()
    yield

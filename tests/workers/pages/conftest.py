"""Fixtures of the browser UI tests: a cluster that is never contacted, its environments."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client

from tests.factories import ClusterFactory
from workers_app.models import Cluster, Environment, EnvironmentField

UNUSED_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nbm90LWEta2V5\n-----END OPENSSH PRIVATE KEY-----\n"
)


@pytest.fixture
def offline_free_cluster(db: None) -> Cluster:
    """A shared cluster row that pages show; nothing opens SSH to it (tasks run on commit only,
    and these tests never commit)."""
    cluster = ClusterFactory(name="hpc", reachability="online", shared=True)
    cluster.set_private_key(UNUSED_KEY)
    cluster.save()
    return cluster


@pytest.fixture
def compute_env(offline_free_cluster: Cluster) -> Environment:
    env = Environment.objects.create(
        cluster=offline_free_cluster,
        name="compute",
        partition="debug",
        nodes_total=4,
        nodes_available=3,
    )
    EnvironmentField.objects.create(
        environment=env,
        name="walltime",
        label="Wall time",
        default="01:00:00",
        example="04:00:00",
        pattern=r"\d{1,2}:\d{2}:\d{2}",
        directive="--time={value}",
        position=0,
    )
    EnvironmentField.objects.create(
        environment=env,
        name="account",
        label="Account",
        required=True,
        example="proj-42",
        directive="--account={value}",
        position=1,
    )
    EnvironmentField.objects.create(
        environment=env,
        name="qos",
        label="QoS",
        choices=["normal", "high"],
        default="normal",
        directive="--qos={value}",
        position=2,
    )
    return env


@pytest.fixture
def alice(client: Client, user: AbstractUser) -> Client:
    client.force_login(user)
    return client


SCREENSHOTS_TAKEN = pytest.StashKey[Path]()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    folder = config.stash.get(SCREENSHOTS_TAKEN, None)
    if folder is not None:
        terminalreporter.write_line(f"screenshots of the browser UI: {folder}/ (look at them)")

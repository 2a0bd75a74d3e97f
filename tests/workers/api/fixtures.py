"""Fixtures shared by the API and CLI tests: one cluster, its environments, a user's API key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import AbstractUser
from rest_framework.test import APIClient

from workers_app.actions import requests
from workers_app.models import ApiKey, Cluster, Environment, EnvironmentField, Worker

WALLTIME_PATTERN = r"^\d{1,2}:\d{2}:\d{2}$"


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster("test-slurm")


@pytest.fixture
def compute_env(cluster: Cluster) -> Environment:
    env = Environment.objects.create(
        cluster=cluster, name="compute", partition="debug", nodes_total=4, nodes_available=3
    )
    EnvironmentField.objects.create(
        environment=env,
        name="walltime",
        label="Wall time",
        default="01:00:00",
        pattern=WALLTIME_PATTERN,
        directive="--time={value}",
        position=0,
    )
    EnvironmentField.objects.create(
        environment=env,
        name="account",
        label="Account",
        required=True,
        directive="--account={value}",
        position=1,
    )
    EnvironmentField.objects.create(
        environment=env,
        name="qos",
        label="QoS",
        choices=["normal", "high"],
        directive="--qos={value}",
        position=2,
    )
    return env


@pytest.fixture
def retired_env(cluster: Cluster) -> Environment:
    return Environment.objects.create(cluster=cluster, name="retired", is_active=False)


@pytest.fixture
def api_key(user: AbstractUser) -> str:
    _, secret = ApiKey.issue(user, name="tests")
    return secret


@pytest.fixture
def api(api_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    return client


@pytest.fixture
def request_worker(compute_env: Environment) -> Callable[..., Worker]:
    """Request a worker the way the API does, with a valid account by default."""

    def request(owner: AbstractUser, **overrides: Any) -> Worker:
        kwargs: dict[str, Any] = {
            "cluster": compute_env.cluster.name,
            "environment": compute_env.name,
            "params": {"account": "proj1"},
        }
        kwargs.update(overrides)
        return requests.request_worker(owner=owner, **kwargs)

    return request

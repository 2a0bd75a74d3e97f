"""Operators limit a cluster or an environment to groups: others do not see it in the API,
the request dialog or the sessions' targets, and cannot request a worker there by name."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import AbstractUser, Group
from django.test import Client
from rest_framework.test import APIClient

from core.errors import ParameterError
from workers_app.actions import requests
from workers_app.models import ApiKey, Cluster, Environment

pytestmark = pytest.mark.django_db


def api_for(user: AbstractUser) -> APIClient:
    _, secret = ApiKey.issue(user, name="groups")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def names(response: object) -> list[str]:
    return [row["name"] for row in response.json()["results"]]  # type: ignore[attr-defined]


@pytest.fixture
def gpu(make_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = make_cluster("gpu-cluster")
    Environment.objects.create(cluster=cluster, name="a100", partition="debug")
    cluster.allowed_groups.add(Group.objects.create(name="gpu-users"))
    return cluster


@pytest.fixture
def restricted_env(compute_env: Environment) -> Environment:
    env = Environment.objects.create(cluster=compute_env.cluster, name="big", partition="debug")
    env.allowed_groups.add(Group.objects.create(name="big-users"))
    return env


def test_a_cluster_limited_to_a_group_is_seen_only_by_its_members_and_operators(
    gpu: Cluster, compute_env: Environment, user: AbstractUser, other_user: AbstractUser
) -> None:
    other_user.groups.add(Group.objects.get(name="gpu-users"))
    operator = type(user).objects.create_user("operator", is_staff=True)

    assert names(api_for(user).get("/api/clusters/")) == ["test-slurm"]
    assert api_for(user).get("/api/clusters/gpu-cluster/").status_code == 404
    assert api_for(user).get("/api/clusters/gpu-cluster/environments/").status_code == 404
    assert names(api_for(other_user).get("/api/clusters/")) == ["gpu-cluster", "test-slurm"]
    assert names(api_for(other_user).get("/api/clusters/gpu-cluster/environments/")) == ["a100"]
    assert names(api_for(operator).get("/api/clusters/")) == ["gpu-cluster", "test-slurm"]


def test_an_environment_limited_to_a_group_is_hidden_and_cannot_be_requested_by_others(
    restricted_env: Environment, user: AbstractUser, other_user: AbstractUser
) -> None:
    other_user.groups.add(Group.objects.get(name="big-users"))
    path = "/api/clusters/test-slurm/environments/"

    assert names(api_for(user).get(path)) == ["compute"]
    assert api_for(user).get(path + "big/").status_code == 404
    assert names(api_for(other_user).get(path)) == ["big", "compute"]
    with pytest.raises(ParameterError, match="unknown environment 'big'"):
        requests.request_worker(owner=user, cluster="test-slurm", environment="big", params={})
    refused = api_for(user).post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "big", "params": {}},
        format="json",
    )
    assert refused.status_code == 400
    assert "unknown environment" in refused.content.decode()
    worker = requests.request_worker(
        owner=other_user, cluster="test-slurm", environment="big", params={}
    )
    assert worker.environment_id == restricted_env.pk


def test_a_cluster_hidden_from_a_user_cannot_be_requested_by_name(
    gpu: Cluster, user: AbstractUser
) -> None:
    with pytest.raises(ParameterError, match="unknown cluster 'gpu-cluster'"):
        requests.request_worker(owner=user, cluster="gpu-cluster", environment="a100", params={})


def compute_env_of(env: Environment) -> Environment:
    return Environment.objects.get(cluster=env.cluster, name="compute")


def test_the_request_dialog_and_the_clusters_page_offer_only_what_the_user_may_see(
    client: Client,
    gpu: Cluster,
    restricted_env: Environment,
    user: AbstractUser,
    other_user: AbstractUser,
) -> None:
    client.force_login(user)
    dialog = client.get("/workers/new/").content.decode()
    listing = client.get("/clusters/").content.decode()
    sessions = client.get("/sessions/new/").content.decode()

    assert "gpu-cluster" not in dialog + listing + sessions
    assert "a100" not in dialog + sessions
    assert f'value="{restricted_env.pk}"' not in dialog
    assert f'value="{compute_env_of(restricted_env).pk}"' in dialog
    assert client.get("/clusters/gpu-cluster/account/").status_code == 404

    other_user.groups.add(Group.objects.get(name="gpu-users"))
    client.force_login(other_user)
    assert "a100" in client.get("/workers/new/").content.decode()

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from workers_app.models import AgentRelay, AgentRoute, Cluster, Environment, EnvironmentField

pytestmark = pytest.mark.django_db


def test_clusters_show_name_scheduler_and_reachability_but_no_connection_details(
    api: APIClient, cluster: Cluster
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(
        reachability="online", last_contact_at=timezone.now()
    )

    response = api.get("/api/clusters/")

    assert response.status_code == 200
    [shown] = response.json()["results"]
    assert set(shown) == {
        "name",
        "scheduler",
        "reachability",
        "last_contact_at",
        "shared",
        "account",
        "agent_route",
        "relay_state",
        "login",
        "unix_name",
    }
    assert (shown["agent_route"], shown["relay_state"]) == ("direct", None)
    assert shown["name"] == "test-slurm"
    assert shown["scheduler"] == "slurm"
    assert shown["reachability"] == "online"
    body = response.content.decode()
    for secret in (cluster.host_key, cluster.private_key_encrypted, cluster.username):
        assert secret not in body


def test_a_cluster_whose_agents_go_via_the_login_host_shows_its_relay_but_not_where_it_is(
    api: APIClient, cluster: Cluster
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(agent_route=AgentRoute.VIA_LOGIN_HOST)
    assert api.get("/api/clusters/test-slurm/").json()["relay_state"] == "unknown"

    relay = AgentRelay.objects.create(
        cluster=cluster, state="up", address="login7.hpc.example:40999", checked_at=timezone.now()
    )
    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/clusters/")
    [shown] = response.json()["results"]
    assert (shown["agent_route"], shown["relay_state"]) == ("via_login_host", "up")
    assert "login7" not in response.content.decode()
    # Read with the clusters, not one query per cluster.
    assert not [q for q in queries.captured_queries if 'FROM "workers_app_agentrelay"' in q["sql"]]

    # Nobody confirmed it for longer than a lease (run_relays is not running): unknown.
    AgentRelay.objects.filter(pk=relay.pk).update(checked_at=timezone.now() - timedelta(minutes=10))
    assert api.get("/api/clusters/test-slurm/").json()["relay_state"] == "unknown"


def test_one_cluster_by_name_and_unknown_is_404(api: APIClient, cluster: Cluster) -> None:
    assert api.get("/api/clusters/test-slurm/").json()["name"] == "test-slurm"
    assert api.get("/api/clusters/nope/").status_code == 404


def test_environments_list_settable_fields_in_order_and_node_counts(
    api: APIClient, compute_env: Environment, retired_env: Environment
) -> None:
    response = api.get("/api/clusters/test-slurm/environments/")

    assert response.status_code == 200
    compute, retired = response.json()["results"]
    assert compute["name"] == "compute"
    assert compute["cluster"] == "test-slurm"
    assert compute["active"] is True
    assert (compute["nodes_total"], compute["nodes_available"]) == (4, 3)
    assert [f["name"] for f in compute["fields"]] == ["walltime", "account", "qos"]
    walltime, account, qos = compute["fields"]
    assert walltime == {
        "name": "walltime",
        "label": "Wall time",
        "kind": "value",
        "default": "01:00:00",
        "required": False,
        "pattern": r"^\d{1,2}:\d{2}:\d{2}$",
        "choices": [],
    }
    assert (account["required"], account["default"]) == (True, "")
    assert qos["choices"] == ["normal", "high"]
    assert retired["active"] is False


def test_one_environment_and_unknown_cluster_or_environment_is_404(
    api: APIClient, compute_env: Environment
) -> None:
    assert api.get("/api/clusters/test-slurm/environments/compute/").json()["name"] == "compute"
    assert api.get("/api/clusters/test-slurm/environments/nope/").status_code == 404
    assert api.get("/api/clusters/nope/environments/").status_code == 404
    assert api.get("/api/clusters/nope/environments/compute/").status_code == 404


def test_environments_of_another_cluster_are_not_mixed_in(
    api: APIClient, compute_env: Environment
) -> None:
    other = Cluster.objects.create(name="other", host="h", username="u", scheduler="pbs")
    env = Environment.objects.create(cluster=other, name="compute")
    EnvironmentField.objects.create(environment=env, name="select")

    response = api.get("/api/clusters/other/environments/compute/")

    assert [f["name"] for f in response.json()["fields"]] == ["select"]


@pytest.mark.parametrize("count", [2, 40])
def test_an_environment_page_takes_the_same_queries_however_many(
    api: APIClient, cluster: Cluster, count: int
) -> None:
    for i in range(count):
        env = Environment.objects.create(cluster=cluster, name=f"env-{i}")
        EnvironmentField.objects.create(environment=env, name="walltime")
    api.get("/api/me/")  # the key's last use is recorded once, outside the measured request

    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/clusters/test-slurm/environments/")

    assert response.json()["count"] == count
    # The key with its user, the cluster, the count, the page, the fields of the page.
    assert len(queries) == 5, [q["sql"] for q in queries.captured_queries]

"""Requests are checked before anything reaches a cluster: raw directives against an allowlist,
and the requester's own account on clusters that are not shared."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from workers_app.models import (
    Cluster,
    ClusterAccount,
    Environment,
    EnvironmentField,
    Worker,
    WorkerCommand,
)


@pytest.fixture
def with_directives(compute_env: Environment) -> Environment:
    EnvironmentField.objects.create(
        environment=compute_env, name="directives", kind="directives", position=3
    )
    return compute_env


@pytest.mark.parametrize(
    "directive",
    [
        "--outp=/tmp/steal",
        "--job-nam=other",
        "--arr=0-3",
        "--parti=vip",
        "--account=someone-elses",
        "--time=99:00:00",
        "--hold",
        "--uid=0",
    ],
)
def test_abbreviated_or_overriding_directives_are_refused_naming_the_field(
    api: APIClient, with_directives: Environment, directive: str
) -> None:
    response = api.post(
        "/api/workers/",
        {
            "cluster": "test-slurm",
            "environment": "compute",
            "params": {"account": "proj1", "directives": f"--mem=1G\n{directive}"},
        },
        format="json",
    )

    assert response.status_code == 400
    assert response.json()["field"] == "directives"
    assert directive in response.json()["detail"]
    if directive.startswith(("--account", "--time")):
        assert "use the" in response.json()["detail"]
    assert not Worker.objects.exists()


def test_allowed_directives_are_kept_in_what_will_be_submitted(
    api: APIClient, with_directives: Environment
) -> None:
    response = api.post(
        "/api/workers/",
        {
            "cluster": "test-slurm",
            "environment": "compute",
            "params": {"account": "proj1", "directives": "--mem=1G\n--constraint=a100"},
        },
        format="json",
    )

    assert response.status_code == 201, response.json()
    worker = Worker.objects.get()
    assert worker.job_partition == "debug"
    assert worker.job_directives == [
        "--time=01:00:00",
        "--account=proj1",
        "--mem=1G",
        "--constraint=a100",
    ]


def test_without_an_account_on_a_per_user_cluster_a_request_is_refused_saying_how_to_connect(
    api: APIClient, compute_env: Environment, cluster: Cluster
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(shared=False)

    response = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}},
        format="json",
    )

    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "cluster"
    assert "test-slurm" in body["detail"]
    assert "pw cluster connect test-slurm --user" in body["detail"]
    assert not Worker.objects.exists()


def test_an_unverified_account_is_not_enough(
    api: APIClient, compute_env: Environment, cluster: Cluster, user
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(shared=False)
    connected = api.post(
        "/api/clusters/test-slurm/account/", {"remote_username": "alice"}, format="json"
    )
    assert connected.status_code == 201
    assert connected.json()["verified"] is False
    assert connected.json()["public_key"].startswith("ssh-ed25519 ")
    assert "PRIVATE" not in str(connected.json())

    response = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}},
        format="json",
    )

    assert response.status_code == 400 and response.json()["field"] == "cluster"
    listed = api.get("/api/clusters/").json()["results"][0]
    assert listed["account"]["remote_username"] == "alice"
    assert listed["account"]["verified"] is False
    assert ClusterAccount.objects.get(user=user).private_key().startswith("-----BEGIN OPENSSH")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"remote_username": "alice;id"}, "remote_username"),
        ({"remote_username": "alice", "private_key": "not a key"}, "private_key"),
        ({"remote_username": "alice", "private_key": "ssh-ed25519 AAAA alice@x"}, "private_key"),
    ],
)
def test_a_bad_account_is_refused_naming_the_field(
    api: APIClient, cluster: Cluster, body: dict[str, str], field: str
) -> None:
    response = api.post("/api/clusters/test-slurm/account/", body, format="json")

    assert response.status_code == 400
    assert response.json()["field"] == field
    assert not ClusterAccount.objects.exists()


def test_another_users_account_is_never_shown(api: APIClient, cluster: Cluster, other_user) -> None:
    ClusterAccount.objects.create(
        user=other_user, cluster=cluster, remote_username="bob", origin="generated"
    )

    listed = api.get("/api/clusters/").json()["results"][0]

    assert listed["account"] is None
    assert api.post("/api/clusters/test-slurm/account/verify/").status_code == 404


def test_staff_see_and_delete_anyones_worker_but_only_the_owner_runs_commands(
    request_worker, user, other_user
) -> None:
    worker = request_worker(user)
    other_user.is_staff = True
    other_user.save()
    staff = APIClient()
    staff.force_authenticate(other_user)

    assert staff.get(f"/api/workers/{worker.public_id}/").status_code == 200
    refused = staff.post(
        f"/api/workers/{worker.public_id}/exec/", {"command": ["id"]}, format="json"
    )
    assert refused.status_code == 403
    assert "owner" in refused.json()["detail"]
    assert not worker.commands.exists()
    assert staff.delete(f"/api/workers/{worker.public_id}/").status_code == 202
    worker.refresh_from_db()
    assert worker.status == "stopped"


def test_operators_see_every_command_run_on_workers_in_the_admin(
    admin_client, request_worker, user
) -> None:
    worker = request_worker(user)
    WorkerCommand.objects.create(worker=worker, user=user, command=["cat", "/etc/hostname"])

    page = admin_client.get("/admin/workers_app/workercommand/")

    assert page.status_code == 200
    assert "cat /etc/hostname" in page.content.decode()
    assert worker.public_id in page.content.decode()


def test_a_shared_cluster_without_an_account_of_its_own_refuses_requests_at_once(
    api: APIClient, compute_env: Environment, cluster: Cluster
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(username="", private_key_encrypted="")

    response = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}},
        format="json",
    )

    assert response.status_code == 400
    assert "shared but has no account" in response.json()["detail"]
    assert not Worker.objects.exists()

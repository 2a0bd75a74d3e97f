"""Work picked up again: "request again" on a worker, and requests saved under a name. Each makes
a worker whose stored job (partition, directives, fields, account) equals the first's."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AbstractUser
from rest_framework.test import APIClient

from tests.factories import WorkerFactory
from workers_app.actions import deletion
from workers_app.models import ApiKey, Environment, EnvironmentField, SavedRequest, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db

FIELDS = {"walltime": "02:30:00", "account": "proj1", "qos": "high"}


def job_spec(worker: Worker) -> tuple[Any, ...]:
    return (
        worker.cluster_id,
        worker.environment_id,
        worker.account_id,
        worker.job_partition,
        worker.job_directives,
        worker.params,
    )


def client_of(user: AbstractUser) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.issue(user)[1]}")
    return client


def test_request_again_makes_a_worker_with_the_same_job_and_name(
    api: APIClient, user: AbstractUser, compute_env: Environment
) -> None:
    first = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": FIELDS, "name": "runs"},
        format="json",
    ).json()
    deletion.delete_worker(Worker.objects.get(public_id=first["id"]))  # ended: still possible

    answer = api.post(f"/api/workers/{first['id']}/again/", format="json")

    assert answer.status_code == 201, answer.content
    again = Worker.objects.get(public_id=answer.json()["id"])
    original = Worker.objects.get(public_id=first["id"])
    assert again.pk != original.pk and again.status == "pending"
    assert job_spec(again) == job_spec(original)
    assert original.job_directives == ["--time=02:30:00", "--account=proj1", "--qos=high"]
    assert again.name == "runs"


def test_a_name_the_platform_gave_is_given_anew(api: APIClient, compute_env: Environment) -> None:
    first = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}},
        format="json",
    ).json()
    again = api.post(f"/api/workers/{first['id']}/again/", format="json").json()
    assert first["name"] == f"compute-{first['id']}"
    assert again["name"] == f"compute-{again['id']}"


def test_request_again_is_idempotent_per_key_and_checks_the_fields_as_they_are_now(
    api: APIClient, compute_env: Environment
) -> None:
    first = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": FIELDS},
        format="json",
    ).json()
    url = f"/api/workers/{first['id']}/again/"
    made = api.post(url, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    repeated = api.post(url, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (made.status_code, repeated.status_code) == (201, 200)
    assert made.json()["id"] == repeated.json()["id"]

    # The operator has since dropped "high" from the QoS choices: refused, naming the field.
    EnvironmentField.objects.filter(environment=compute_env, name="qos").update(choices=["normal"])
    refused = api.post(url, format="json")
    assert refused.status_code == 400
    assert refused.json()["field"] == "qos"
    assert Worker.objects.count() == 2


def test_only_the_owner_requests_a_worker_again(
    user: AbstractUser,
    other_user: AbstractUser,
    admin_user: AbstractUser,
    request_worker: Any,
) -> None:
    worker = request_worker(user)
    url = f"/api/workers/{worker.public_id}/again/"
    assert client_of(other_user).post(url, format="json").status_code == 404
    staff = client_of(admin_user).post(url, format="json")
    assert staff.status_code == 403
    assert "owner" in staff.json()["detail"]
    assert Worker.objects.count() == 1


def test_a_saved_request_is_checked_kept_replaced_listed_and_forgotten(
    api: APIClient, user: AbstractUser, other_user: AbstractUser, compute_env: Environment
) -> None:
    body = {"name": "long-run", "cluster": "test-slurm", "environment": "compute"}
    saved = api.post("/api/saved-requests/", {**body, "params": FIELDS}, format="json")
    assert saved.status_code == 201, saved.content
    assert saved.json()["params"] == FIELDS

    fewer = {**body, "params": {"account": "p2"}}
    replaced = api.post("/api/saved-requests/", fewer, format="json")
    assert replaced.status_code == 200
    # Kept with the defaults filled in, as a worker's fields are.
    assert replaced.json()["params"] == {"walltime": "01:00:00", "account": "p2"}

    wrong = {**body, "name": "x", "params": {**FIELDS, "qos": "top"}}
    bad = api.post("/api/saved-requests/", wrong, format="json")
    assert (bad.status_code, bad.json()["field"]) == (400, "qos")
    badly_named = api.post(
        "/api/saved-requests/", {**body, "name": "a b", "params": FIELDS}, format="json"
    )
    assert (badly_named.status_code, badly_named.json()["field"]) == (400, "name")
    assert list(SavedRequest.objects.values_list("name", flat=True)) == ["long-run"]

    listed = api.get("/api/saved-requests/").json()["results"]
    assert [(s["name"], s["cluster"], s["environment"]) for s in listed] == [
        ("long-run", "test-slurm", "compute")
    ]
    assert client_of(other_user).get("/api/saved-requests/long-run/").status_code == 404
    assert api.delete("/api/saved-requests/long-run/").status_code == 204
    assert api.get("/api/saved-requests/long-run/").status_code == 404


def test_a_session_again_gets_a_worker_like_its_own_or_its_connected_worker(
    api: APIClient, user: AbstractUser, compute_env: Environment
) -> None:
    body = {"type": "desktop", "cluster": "test-slurm", "environment": "compute"}
    first = api.post("/api/sessions/", {**body, "params": FIELDS}, format="json").json()
    again = api.post(f"/api/sessions/{first['id']}/again/", format="json")
    assert again.status_code == 201, again.content
    assert (again.json()["type"], again.json()["dedicated_worker"]) == ("desktop", True)
    workers = [Worker.objects.get(public_id=s["worker"]) for s in (first, again.json())]
    assert workers[0].pk != workers[1].pk
    assert job_spec(workers[0]) == job_spec(workers[1])

    shared = WorkerFactory(
        owner=user, cluster=compute_env.cluster, status=WorkerStatus.CONNECTED, node_hostname="n"
    )
    on_it = {"type": "jupyter", "cluster": "test-slurm", "worker": shared.public_id}
    second = api.post("/api/sessions/", on_it, format="json").json()
    beside = api.post(f"/api/sessions/{second['id']}/again/", format="json").json()
    assert (beside["type"], beside["worker"]) == ("jupyter", shared.public_id)
    Worker.objects.filter(pk=shared.pk).update(status=WorkerStatus.STOPPED)
    ended = api.post(f"/api/sessions/{second['id']}/again/", format="json")
    assert (ended.status_code, ended.json()["field"]) == (400, "worker")
    assert "stopped, not connected" in ended.json()["detail"]

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from workers_app.actions import lifecycle
from workers_app.models import ApiKey, Environment, Worker, WorkerEvent
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db

RequestWorker = Callable[..., Worker]

WORKER_KEYS = {
    "idle_minutes",
    "idle_since",
    "idle_warned_at",
    "activity",
    "id",
    "name",
    "cluster",
    "environment",
    "status",
    "status_reason",
    "scheduler_job_id",
    "node_hostname",
    "params",
    "scheduler_state",
    "exit_code",
    "created_at",
    "updated_at",
    "submitted_at",
    "connected_at",
    "finished_at",
}


def client_for(user: AbstractUser) -> APIClient:
    _, secret = ApiKey.issue(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def ids(response: Any) -> list[str]:
    return [w["id"] for w in response.json()["results"]]


# Create


def test_create_records_a_pending_worker_with_defaults_filled_in(
    api: APIClient, user: AbstractUser, compute_env: Environment
) -> None:
    response = api.post(
        "/api/workers/",
        {
            "cluster": "test-slurm",
            "environment": "compute",
            "params": {"walltime": "02:00:00", "account": "proj1"},
            "name": "my-node",
        },
        format="json",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == WORKER_KEYS
    worker = Worker.objects.get()
    assert body["id"] == worker.public_id
    assert worker.owner == user
    assert body["name"] == "my-node"
    assert (body["cluster"], body["environment"]) == ("test-slurm", "compute")
    assert body["status"] == "pending"
    assert body["params"] == {"walltime": "02:00:00", "account": "proj1"}
    assert [e.reason for e in WorkerEvent.objects.filter(worker=worker)] == ["Requested"]


def test_create_names_the_worker_after_its_environment_by_default(
    api: APIClient, compute_env: Environment
) -> None:
    body = api.post(
        "/api/workers/",
        {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}},
        format="json",
    ).json()

    assert body["name"] == f"compute-{body['id']}"
    assert body["params"] == {"walltime": "01:00:00", "account": "p"}


@pytest.mark.parametrize(
    ("body", "field", "detail"),
    [
        ({"cluster": "nope", "environment": "compute"}, "cluster", "unknown cluster 'nope'"),
        ({"cluster": "test-slurm", "environment": "nope"}, "environment", "unknown environment"),
        ({"cluster": "test-slurm", "environment": "retired"}, "environment", "inactive"),
        ({"cluster": "test-slurm", "environment": "compute"}, "account", "is required"),
        (
            {"cluster": "test-slurm", "environment": "compute", "params": {"gpus": "1"}},
            "gpus",
            "unknown field",
        ),
        (
            {
                "cluster": "test-slurm",
                "environment": "compute",
                "params": {"account": "p", "walltime": "1 hour"},
            },
            "walltime",
            "is not a valid value",
        ),
        (
            {
                "cluster": "test-slurm",
                "environment": "compute",
                "params": {"account": "p", "qos": "urgent"},
            },
            "qos",
            "must be one of: normal, high",
        ),
        (
            {
                "cluster": "test-slurm",
                "environment": "compute",
                "params": {"account": {"nested": "object"}},
            },
            "account",
            "must be a string",
        ),
        ({"environment": "compute"}, "cluster", "required"),
        ({"cluster": "test-slurm"}, "environment", "required"),
        (
            {"cluster": "test-slurm", "environment": "compute", "params": "walltime=1"},
            "params",
            "dictionary",
        ),
        (
            {"cluster": "test-slurm", "environment": "compute", "name": "a\nb"},
            "name",
            "printable characters",
        ),
        ({"cluster": "test\x00slurm", "environment": "compute"}, "cluster", "Null characters"),
    ],
)
def test_create_rejects_a_bad_request_naming_the_field(
    api: APIClient,
    compute_env: Environment,
    retired_env: Environment,
    body: dict[str, Any],
    field: str,
    detail: str,
) -> None:
    response = api.post("/api/workers/", body, format="json")

    assert response.status_code == 400
    error = response.json()
    assert set(error) == {"field", "detail"}
    assert error["field"] == field
    assert detail in error["detail"]
    assert not Worker.objects.exists()


def test_create_with_a_malformed_body_is_400_without_a_field(
    api: APIClient, compute_env: Environment
) -> None:
    response = api.post("/api/workers/", "{not json", content_type="application/json")

    assert response.status_code == 400
    assert response.json()["field"] is None
    assert "JSON" in response.json()["detail"]


# List and get


def test_users_list_only_their_own_workers_and_staff_list_all(
    api: APIClient,
    user: AbstractUser,
    other_user: AbstractUser,
    request_worker: RequestWorker,
) -> None:
    mine = request_worker(user)
    theirs = request_worker(other_user)
    staff = get_user_model().objects.create_user("root", is_staff=True)

    assert ids(api.get("/api/workers/")) == [mine.public_id]
    assert ids(client_for(staff).get("/api/workers/")) == [theirs.public_id, mine.public_id]


def test_list_is_newest_first_with_id_breaking_ties(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    workers = [request_worker(user) for _ in range(3)]
    same_time = timezone.now()
    Worker.objects.filter(pk__in=[w.pk for w in workers[:2]]).update(created_at=same_time)
    Worker.objects.filter(pk=workers[2].pk).update(created_at=same_time - timedelta(hours=1))

    assert ids(api.get("/api/workers/")) == [
        w.public_id for w in (workers[1], workers[0], workers[2])
    ]


def test_list_filters_by_cluster_name_and_status(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    pending = request_worker(user)
    queued = request_worker(user)
    lifecycle.mark_submitted(queued, job_id="101")

    assert ids(api.get("/api/workers/", {"status": "queued"})) == [queued.public_id]
    assert ids(api.get("/api/workers/", {"status": "pending"})) == [pending.public_id]
    assert len(ids(api.get("/api/workers/", {"cluster": "test-slurm"}))) == 2
    assert ids(api.get("/api/workers/", {"cluster": "other"})) == []


def test_an_unknown_status_filter_is_400_naming_it(api: APIClient) -> None:
    response = api.get("/api/workers/", {"status": "running"})

    assert response.status_code == 400
    assert response.json()["field"] == "status"
    assert "must be one of" in response.json()["detail"]


def test_list_is_paginated_with_limit_and_offset(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    workers = [request_worker(user) for _ in range(3)]

    page = api.get("/api/workers/", {"limit": 2, "offset": 1}).json()

    assert page["count"] == 3
    assert [w["id"] for w in page["results"]] == [workers[1].public_id, workers[0].public_id]


def test_get_shows_own_worker_by_public_id_only(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)

    assert api.get(f"/api/workers/{worker.public_id}/").json()["id"] == worker.public_id
    assert api.get(f"/api/workers/{worker.pk}/").status_code == 404


def test_another_users_worker_is_404_everywhere_but_visible_to_staff(
    api: APIClient, other_user: AbstractUser, request_worker: RequestWorker
) -> None:
    theirs = request_worker(other_user)
    url = f"/api/workers/{theirs.public_id}/"

    assert api.get(url).status_code == 404
    assert api.get(f"{url}events/").status_code == 404
    assert api.post(f"{url}exec/", {"command": ["id"]}, format="json").status_code == 404
    assert api.delete(url).status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == WorkerStatus.PENDING

    staff = get_user_model().objects.create_user("root", is_staff=True)
    assert client_for(staff).get(url).status_code == 200


def test_a_finished_worker_is_shown_until_purged_then_404(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    lifecycle.fail_worker(worker, reason="Timed out waiting for worker to connect")
    url = f"/api/workers/{worker.public_id}/"

    shown = api.get(url).json()
    assert (shown["status"], shown["status_reason"]) == ("error", worker.status_reason)
    assert ids(api.get("/api/workers/")) == [worker.public_id]

    long_ago = timezone.now() - timedelta(seconds=settings.ACTIVATE_PURGE_AFTER + 1)
    Worker.objects.filter(pk=worker.pk).update(finished_at=long_ago)
    assert api.get(url).status_code == 404
    assert ids(api.get("/api/workers/")) == []


@pytest.mark.parametrize("count", [5, 200])
def test_a_list_page_takes_the_same_queries_however_many_workers(
    api: APIClient, user: AbstractUser, compute_env: Environment, count: int
) -> None:
    Worker.objects.bulk_create(
        Worker(
            owner=user,
            cluster=compute_env.cluster,
            environment=compute_env,
            name=f"w{i}",
            params={"account": "p"},
            # Statuses mixed: connected ones are looked at for idleness, once for the page.
            status=("pending", "connected", "queued")[i % 3],
        )
        for i in range(count)
    )
    api.get("/api/me/")  # the key's last use is recorded once, outside the measured request

    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/workers/")

    assert response.json()["count"] == count
    # The key with its user, the count, the page with cluster and environment joined, and the
    # terminals open on the page's connected workers.
    assert len(queries) == 4, [q["sql"] for q in queries.captured_queries]


# Delete


def test_deleting_a_worker_that_was_never_submitted_stops_it_at_once(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)

    response = api.delete(f"/api/workers/{worker.public_id}/")

    assert response.status_code == 202
    assert response.json()["status"] == "stopped"
    assert response.json()["finished_at"] is not None
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED


def test_deleting_a_worker_with_a_job_asks_for_cancel_and_is_idempotent(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    lifecycle.mark_submitted(worker, job_id="4242")
    url = f"/api/workers/{worker.public_id}/"

    first = api.delete(url)
    second = api.delete(url)

    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["status"] == second.json()["status"] == "stopping"
    assert first.json()["scheduler_job_id"] == "4242"
    worker.refresh_from_db()
    assert worker.cancel_requested is True
    assert WorkerEvent.objects.filter(worker=worker, new_status="stopping").count() == 1


def test_deleting_a_finished_worker_answers_its_state_unchanged(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    lifecycle.fail_worker(worker, reason="boom")

    response = api.delete(f"/api/workers/{worker.public_id}/")

    assert response.status_code == 202
    assert (response.json()["status"], response.json()["status_reason"]) == ("error", "boom")


# Events


def test_events_tell_the_workers_history_oldest_first(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    lifecycle.mark_submitted(worker, job_id="7")
    lifecycle.mark_connected(worker, hostname="node01")
    api.delete(f"/api/workers/{worker.public_id}/")

    response = api.get(f"/api/workers/{worker.public_id}/events/")

    assert response.status_code == 200
    events = response.json()["results"]
    assert [(e["old_status"], e["new_status"]) for e in events] == [
        ("pending", "pending"),
        ("pending", "queued"),
        ("queued", "connected"),
        ("connected", "stopping"),
    ]
    assert events[0]["reason"] == "Requested"
    assert events[-1]["reason"] == lifecycle.REASON_DELETED


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/api/workers/a%00b/", 404),
        ("/api/workers/a%00b/events/", 404),
        ("/api/clusters/a%00b/", 404),
        ("/api/clusters/a%00b/environments/", 404),
        ("/api/clusters/test-slurm/environments/a%00b/", 404),
        ("/api/workers/?cluster=a%00b", 400),
        ("/api/workers/?status=a%00b", 400),
    ],
)
def test_a_nul_byte_in_a_lookup_or_filter_is_a_client_error(
    api: APIClient, compute_env: Environment, url: str, expected: int
) -> None:
    response = api.get(url)

    assert response.status_code == expected
    assert "detail" in response.json()


def test_a_worker_whose_environment_was_deleted_shows_none(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker, compute_env: Environment
) -> None:
    worker = request_worker(user)
    compute_env.delete()

    shown = api.get(f"/api/workers/{worker.public_id}/").json()

    assert (shown["cluster"], shown["environment"]) == ("test-slurm", None)


def test_a_command_on_a_worker_that_is_not_connected_is_refused_with_409(
    api: APIClient, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    url = f"/api/workers/{worker.public_id}/exec/"
    response = api.post(url, {"command": ["hostname"]}, format="json")
    assert response.status_code == 409
    assert "not connected" in response.json()["detail"]
    assert api.post(url, {"command": []}, format="json").json()["field"] == "command"

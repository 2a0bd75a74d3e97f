"""Many workers in one request: one transaction, one broker message, one answer listing them,
and a retried request makes none more."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core import statemachine
from workers_app import effects
from workers_app.models import Environment, Worker, WorkerEvent

pytestmark = pytest.mark.django_db

BODY = {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}}


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """The messages sent to the broker."""
    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(statemachine, "_enqueue", lambda task, args: sent.append((task, args)))
    return sent


def test_a_count_makes_that_many_workers_with_one_message(
    api: APIClient, compute_env: Environment, queued: list[Any], django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/workers/", {**BODY, "count": 25, "name": "dask"}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["count"] == 25
    assert [w["name"] for w in body["workers"]] == [f"dask-{n}" for n in range(1, 26)]
    assert {w["status"] for w in body["workers"]} == {"pending"}
    workers = Worker.objects.order_by("pk")
    assert [w.public_id for w in workers] == [w["id"] for w in body["workers"]]
    assert WorkerEvent.objects.filter(reason="Requested").count() == 25
    assert queued == [(effects.SUBMIT_MANY, ([w.pk for w in workers],))]


def test_a_bulk_request_retried_with_its_key_answers_the_same_workers(
    api: APIClient, compute_env: Environment, queued: list[Any]
) -> None:
    first = api.post("/api/workers/", {**BODY, "count": 3}, format="json", HTTP_IDEMPOTENCY_KEY="b")
    again = api.post("/api/workers/", {**BODY, "count": 3}, format="json", HTTP_IDEMPOTENCY_KEY="b")
    single = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="b")

    assert (first.status_code, again.status_code, single.status_code) == (201, 200, 201)
    assert again.json() == first.json()
    assert single.json()["id"] not in {w["id"] for w in first.json()["workers"]}
    assert Worker.objects.count() == 4


def test_an_unnamed_bulk_request_names_each_worker_after_its_environment(
    api: APIClient, compute_env: Environment, queued: list[Any]
) -> None:
    body = api.post("/api/workers/", {**BODY, "count": 2}, format="json").json()

    assert [w["name"] for w in body["workers"]] == [f"compute-{w['id']}" for w in body["workers"]]


@pytest.mark.parametrize("count", [0, -1, 501, "many"])
def test_a_count_out_of_range_is_refused_and_nothing_is_stored(
    api: APIClient, compute_env: Environment, queued: list[Any], count: object
) -> None:
    response = api.post("/api/workers/", {**BODY, "count": count}, format="json")

    assert response.status_code == 400
    assert response.json()["field"] == "count"
    assert not Worker.objects.exists()
    assert queued == []


def test_a_bad_parameter_in_a_bulk_request_stores_none(
    api: APIClient, compute_env: Environment, queued: list[Any]
) -> None:
    response = api.post(
        "/api/workers/",
        {**BODY, "count": 5, "params": {"walltime": "soon", "account": "p"}},
        format="json",
    )

    assert response.status_code == 400
    assert not Worker.objects.exists()

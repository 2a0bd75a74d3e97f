"""A write that succeeded answers success: a retried request makes no second worker, and a
broker that cannot take the submission message does not turn a stored request into a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings
from rest_framework.test import APIClient

from activate.celery import app
from workers_app import tasks
from workers_app.models import Environment, Worker

BODY = {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}}


def test_a_request_retried_with_the_same_idempotency_key_makes_one_worker(
    api: APIClient, compute_env: Environment
) -> None:
    first = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    other = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-2")

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json()["id"] == first.json()["id"] != other.json()["id"]
    assert Worker.objects.count() == 2


def test_another_user_may_use_the_same_key(
    api: APIClient, compute_env: Environment, other_user
) -> None:
    theirs = APIClient()
    theirs.force_authenticate(other_user)

    mine = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="same")
    their = theirs.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="same")

    assert (mine.status_code, their.status_code) == (201, 201)
    assert mine.json()["id"] != their.json()["id"]


def test_an_unusable_idempotency_key_is_refused(api: APIClient, compute_env: Environment) -> None:
    response = api.post("/api/workers/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="x" * 300)

    assert response.status_code == 400
    assert response.json()["field"] == "Idempotency-Key"
    assert not Worker.objects.exists()


class Broker:
    """The Celery app's broker, which a test takes down (a closed port: publishing fails as
    with Redis down) and brings back."""

    def __init__(self) -> None:
        self.url = app.conf.broker_url

    def use(self, url: str) -> None:
        # Connections and producers are pooled per process; new pools read the new URL.
        app.conf.broker_url = url
        app._pool = None
        app.amqp._producer_pool = None

    def down(self) -> None:
        self.use("redis://127.0.0.1:1/0")

    def back(self) -> None:
        self.use(self.url)

    def queued(self) -> list[dict[str, Any]]:
        """The messages waiting in the default queue (Celery's Redis list), oldest first."""
        client = redis.Redis.from_url(self.url)
        return [json.loads(raw) for raw in reversed(client.lrange("celery", 0, -1))]


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker()
    broker.down()
    try:
        yield broker
    finally:
        broker.back()


@pytest.mark.django_db(transaction=True)
@override_settings(CELERY_TASK_PUBLISH_RETRY=False)
def test_with_the_broker_down_a_request_is_stored_answered_201_and_dispatched_later(
    api: APIClient, compute_env: Environment, broker: Broker
) -> None:
    response = api.post("/api/workers/", BODY, format="json")

    assert response.status_code == 201
    worker = Worker.objects.get(public_id=response.json()["id"])
    assert worker.status == "pending"
    # The broker comes back; once the first lease has passed, the dispatch sweep (the beat's
    # task, run here) sends its submission: the message is in the broker's queue.
    broker.back()
    Worker.objects.filter(pk=worker.pk).update(next_attempt_at=worker.created_at)
    before = len(broker.queued())
    assert tasks.dispatch_pending() == 1
    sent = broker.queued()[before:]
    assert [m["headers"]["task"] for m in sent] == ["workers_app.tasks.submit_workers"]
    assert str(worker.pk) in sent[0]["headers"]["argsrepr"]


@pytest.mark.parametrize(
    "name", ["tab\there", "bell\x07", "esc\x1b[31mred", "line\nbreak", "x" * 129]
)
def test_worker_names_refuse_control_characters_and_length(
    api: APIClient, compute_env: Environment, name: str
) -> None:
    response = api.post("/api/workers/", {**BODY, "name": name}, format="json")

    assert response.status_code == 400 and response.json()["field"] == "name"
    assert not Worker.objects.exists()

"""Usage: node-hours from connected to stopped, to the second, on the API and the page; and the
caps operators set, which refuse a request over them with a 400 naming the cap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tests.factories import WorkerFactory
from workers_app.models import Cluster, Environment, UsageCap, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db

NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)


def held(
    owner: AbstractUser, cluster: Cluster, start: datetime, seconds: int | None, **params: str
) -> Worker:
    """A worker connected at ``start`` for ``seconds`` (None: still connected)."""
    worker: Worker = WorkerFactory(
        owner=owner,
        cluster=cluster,
        status=WorkerStatus.CONNECTED if seconds is None else WorkerStatus.STOPPED,
        connected_at=start,
        finished_at=None if seconds is None else start + timedelta(seconds=seconds),
        params=params,
    )
    return worker


@pytest.fixture
def november(user: AbstractUser, cluster: Cluster) -> list[Worker]:
    """Three workers of known lengths in November 2026, one of two nodes, and one that began in
    October: 3600 + 1815 + 2 x 45 + 60 (its November part) = 5565 node-seconds."""
    return [
        held(user, cluster, NOVEMBER + timedelta(days=9, hours=10), 3600),
        held(user, cluster, NOVEMBER + timedelta(days=20), 1815),
        held(user, cluster, NOVEMBER + timedelta(days=29, hours=23), 45, numNodes="2"),
        held(user, cluster, NOVEMBER - timedelta(seconds=30), 90),
    ]


def test_node_hours_of_a_month_are_counted_to_the_second(
    api: APIClient, november: list[Worker], other_user: AbstractUser, cluster: Cluster
) -> None:
    held(other_user, cluster, NOVEMBER + timedelta(days=3), 7200)  # someone else's: not shown
    WorkerFactory(owner=november[0].owner, cluster=cluster, status=WorkerStatus.ERROR)

    body = api.get("/api/usage/", {"month": "2026-11"}).json()

    assert (body["since"], body["until"]) == ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    assert body["node_seconds"] == 5565
    assert body["node_hours"] == round(5565 / 3600, 4)
    [row] = body["rows"]
    assert (row["cluster"], row["account"], row["workers"], row["node_seconds"]) == (
        "test-slurm",
        "",
        4,
        5565,
    )
    october = api.get("/api/usage/", {"month": "2026-10"}).json()
    assert october["node_seconds"] == 30  # the October part of the one that spans months


def test_a_worker_still_connected_counts_up_to_now(
    api: APIClient, user: AbstractUser, cluster: Cluster
) -> None:
    held(user, cluster, timezone.now() - timedelta(seconds=120), None)
    seconds = api.get("/api/usage/").json()["node_seconds"]
    assert 120 <= seconds <= 125


def test_the_usage_page_shows_the_same_figures(
    client: Client, user: AbstractUser, november: list[Worker]
) -> None:
    client.force_login(user)
    page = client.get("/usage/?month=2026-11").content.decode()
    assert '<h2 id="usage-month">November 2026</h2>' in page
    assert '<code id="usage-total">1:32:45</code>' in page
    assert '<td id="usage-total-hours">1.5458</td>' in page
    assert 'href="?month=2026-10"' in page


@pytest.mark.parametrize(
    ("query", "field"), [({"month": "11-2026"}, "month"), ({"all": "1"}, "all")]
)
def test_a_bad_month_or_someone_elses_usage_is_refused(
    api: APIClient, query: dict[str, str], field: str
) -> None:
    answer = api.get("/api/usage/", query)
    assert (answer.status_code, answer.json()["field"]) == (400, field)


def test_staff_see_every_users_usage(admin_user: AbstractUser, november: list[Worker]) -> None:
    client = APIClient()
    client.force_authenticate(admin_user)
    rows = client.get("/api/usage/", {"month": "2026-11", "all": "true"}).json()["rows"]
    assert [(r["user"], r["node_seconds"]) for r in rows] == [(november[0].owner.username, 5565)]


def test_a_cap_of_workers_at_once_refuses_the_next_request_with_its_reason(
    api: APIClient, user: AbstractUser, cluster: Cluster, request_worker: Callable[..., Worker]
) -> None:
    UsageCap.objects.create(cluster=cluster, max_workers=2)
    body = {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}}
    assert api.post("/api/workers/", body, format="json").status_code == 201
    over = api.post("/api/workers/", {**body, "count": 2}, format="json")
    assert over.status_code == 400
    assert over.json() == {
        "field": "cluster",
        "detail": "cap reached: at most 2 workers at once on test-slurm (you have 1; this "
        "request asks for 2), set by the operators",
    }
    assert api.post("/api/workers/", body, format="json").status_code == 201
    assert api.post("/api/workers/", body, format="json").status_code == 400
    assert Worker.objects.filter(owner=user).count() == 2


def test_a_users_own_cap_of_node_hours_wins_over_the_clusters(
    api: APIClient, user: AbstractUser, cluster: Cluster, compute_env: Environment
) -> None:
    UsageCap.objects.create(cluster=cluster, max_node_hours_month=100)
    UsageCap.objects.create(cluster=cluster, user=user, max_node_hours_month=1)
    body = {"cluster": "test-slurm", "environment": "compute", "params": {"account": "p"}}
    month = timezone.now().astimezone(UTC).replace(day=1, hour=0, minute=0, second=0)
    held(user, cluster, month, 30, numNodes="100")  # 3000 of the 3600 node-seconds
    assert api.post("/api/workers/", body, format="json").status_code == 201
    held(user, cluster, month + timedelta(seconds=30), 30, numNodes="20")  # 600 more: at the cap

    refused = api.post("/api/workers/", body, format="json")

    assert refused.status_code == 400
    assert refused.json() == {
        "field": "cluster",
        "detail": "cap reached: 1 node-hours a month on test-slurm (used 1.00 this month), set "
        "by the operators",
    }


def test_the_admin_lists_caps_over_this_months_totals_per_account_and_user(
    admin_client: Client, user: AbstractUser, cluster: Cluster
) -> None:
    UsageCap.objects.create(cluster=cluster, user=user, max_workers=3)
    month = timezone.now().astimezone(UTC).replace(day=1, hour=0, minute=0, second=0)
    held(user, cluster, month, 30, numNodes="2")

    page = admin_client.get("/admin/workers_app/usagecap/").content.decode()

    assert f"{user.username} on test-slurm" in page or "test-slurm" in page
    per_account = page[page.index('id="usage-per-account"') : page.index('id="usage-per-user"')]
    assert f"<td>{user.username}</td><td>test-slurm</td><td>(shared)</td><td>1</td>" in per_account
    assert "<td>0:01:00</td>" in per_account
    per_user = page[page.index('id="usage-per-user"') :]
    assert f"<td>{user.username}</td><td>0.0167</td><td>0:01:00</td>" in per_user

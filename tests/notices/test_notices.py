"""Told when it matters: a worker that connects, a wall time running out. Once per worker and
kind, on the page (the feed notices.js polls) and by e-mail (Django's locmem outbox here), each
as its owner chose."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import AbstractUser
from django.core import mail
from django.test import Client
from django.utils import timezone

from core import statemachine
from notices_app import services
from notices_app.models import Notice, NoticePrefs
from tests.factories import ClusterFactory, WorkerFactory
from workers_app.actions import lifecycle
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """Messages to the broker; e-mail ones are run here as the Celery worker would."""
    queued: list[tuple[str, tuple[Any, ...]]] = []

    def enqueue(task: str, args: tuple[Any, ...]) -> None:
        queued.append((task, args))
        if task == services.EMAIL_TASK:
            services.email_notice(*args)

    monkeypatch.setattr(statemachine, "_enqueue", enqueue)
    return queued


@pytest.fixture
def owner(user: AbstractUser) -> AbstractUser:
    user.email = "alice@example.org"
    user.save()
    return user


def queued_worker(owner: AbstractUser, **fields: Any) -> Worker:
    worker: Worker = WorkerFactory(
        owner=owner,
        cluster=ClusterFactory(scheduler="slurm"),
        status=WorkerStatus.QUEUED,
        scheduler_job_id="77",
        name="analysis",
        **fields,
    )
    return worker


def feed(client: Client, after: int = 0) -> list[str]:
    return [n["title"] for n in client.get(f"/notices/feed/?after={after}").json()["notices"]]


def test_a_worker_that_connects_tells_its_owner_once_on_the_page_and_by_email(
    owner: AbstractUser, client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    worker = queued_worker(owner)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.mark_connected(worker, hostname="node7")
    with django_capture_on_commit_callbacks(execute=True):
        assert not lifecycle.mark_connected(worker, hostname="node7")  # no change, no notice

    [message] = mail.outbox
    assert (message.subject, message.to) == ("Worker analysis is connected", [owner.email])
    assert "Its node node7 (" in message.body and "/workers/" in message.body
    client.force_login(owner)
    assert feed(client) == ["Worker analysis is connected"]
    assert feed(client, after=Notice.objects.get().pk) == []
    assert Notice.objects.get().emailed is True


def test_the_wall_time_warning_comes_once_within_its_window(
    owner: AbstractUser, settings: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    settings.ACTIVATE_WALLTIME_WARNING = 600
    now = timezone.now()
    ending = queued_worker(owner, params={"walltime": "01:00:00"})
    later = queued_worker(owner, params={"walltime": "02:00:00"})
    for worker in (ending, later):
        Worker.objects.filter(pk=worker.pk).update(
            status=WorkerStatus.CONNECTED, started_at=now - timedelta(minutes=52)
        )

    with django_capture_on_commit_callbacks(execute=True):
        assert services.warn_walltimes(now) == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert services.warn_walltimes(now + timedelta(minutes=1)) == 0

    [message] = mail.outbox
    assert message.subject == "Worker analysis: wall time ends in 8 min"
    assert "save your work" in message.body
    assert list(Notice.objects.values_list("worker_id", "kind")) == [(ending.pk, "walltime")]


def test_each_kind_can_be_turned_off_each_way(
    owner: AbstractUser, client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(owner)
    saved = client.post("/notices/", {"walltime_page": "on", "connected_email": "on"})
    assert saved.status_code == 302
    prefs = NoticePrefs.objects.get(user=owner)
    assert (prefs.connected_page, prefs.connected_email) == (False, True)
    assert (prefs.walltime_page, prefs.walltime_email) == (True, False)
    worker = queued_worker(owner, params={"walltime": "00:05:00"})

    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.mark_connected(worker, hostname="node7")
        services.warn_walltimes()

    # Connected: by e-mail, not on the page; the wall time: on the page, not by e-mail.
    assert [m.subject for m in mail.outbox] == ["Worker analysis is connected"]
    assert feed(client) == ["Worker analysis: wall time ends in 5 min"]
    page = client.get("/notices/").content.decode()
    assert 'name="connected_email" id="id_connected_email" checked' in page
    assert 'name="connected_page" id="id_connected_page">' in page


def test_a_user_without_an_address_is_told_on_the_page_only(
    user: AbstractUser, client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.mark_connected(queued_worker(user), hostname="node7")
    assert mail.outbox == [] and sent == []
    client.force_login(user)
    assert feed(client) == ["Worker analysis is connected"]
    assert "has no e-mail address" in client.get("/notices/").content.decode()
    assert client.get("/notices/feed/?after=x").status_code == 400

"""Idle workers: the agent's activity reports through the signed heartbeat, what the platform
makes of them (with terminals and proxied traffic), and the policy that warns, then deletes,
unless the owner keeps it. Time is moved by writing "last busy" into the past, as a worker
quiet that long would have it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from core import statemachine
from core.redis_connection import redis_client
from notices_app import services as notices
from notices_app.models import Notice, NoticeKind
from tests.agents.heartbeats.signed import django_post, worker_with_key
from workers_app import idle, sweeps
from workers_app.idle import ACTIVITY_PREFIX
from workers_app.models import TerminalRecord, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db

QUIET = {"span": "20.0", "cpu": "0.00", "io": "0", "sessions": ""}
BUSY = {"span": "20.0", "cpu": "19.50", "io": "0", "sessions": ""}


@pytest.fixture(autouse=True)
def knobs(settings: Any) -> None:
    # A report every 20 s with 1 s beats: 21 s of grace; a 2 min policy warns 30 s ahead.
    settings.ACTIVATE_ACTIVITY_INTERVAL = 20
    settings.ACTIVATE_HEARTBEAT_INTERVAL = 1
    settings.ACTIVATE_IDLE_WARNING = 30
    settings.ACTIVATE_IDLE_SHORTEST = 60


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    queued: list[tuple[str, tuple[Any, ...]]] = []

    def enqueue(task: str, args: tuple[Any, ...]) -> None:
        queued.append((task, args))
        if task == notices.EMAIL_TASK:
            notices.email_notice(*args)

    monkeypatch.setattr(statemachine, "_enqueue", enqueue)
    return queued


def connected(client: Client, *, minutes: float | None = 2.0) -> tuple[Worker, Any]:
    worker, agent = worker_with_key()
    status, answer, _ = django_post(
        client,
        agent,
        "connect",
        {"worker": worker.public_id, "hostname": "node7", "job_id": "123"},
    )
    assert status == 200 and answer["activity_interval"] == 20
    Worker.objects.filter(pk=worker.pk).update(
        idle_minutes=minutes, connected_at=timezone.now() - timedelta(hours=1)
    )
    worker.refresh_from_db()
    worker.owner.email = "alice@example.org"
    worker.owner.save()
    return worker, agent


def beat(client: Client, worker: Worker, agent: Any, report: dict[str, str]) -> None:
    status, answer, signed = django_post(
        client, agent, "heartbeat", {"worker": worker.public_id, **report}
    )
    assert (status, signed) == (200, True), answer


def last_busy(worker: Worker, seconds_ago: float) -> None:
    redis_client().set(f"{ACTIVITY_PREFIX}{worker.pk}", repr(time.time() - seconds_ago))


def state(worker: Worker) -> idle.Idleness:
    worker.refresh_from_db()
    return idle.idleness_of([worker])[worker.pk]


def test_reports_ride_the_signed_beat_and_tell_busy_from_quiet(client: Client) -> None:
    worker, agent = connected(client)
    assert not state(worker).measured  # no report yet: never judged

    beat(client, worker, agent, QUIET)
    first = state(worker)
    assert first.measured and (first.cpu, first.io) == (0.0, 0.0)
    assert first.quiet_since is not None
    assert abs((timezone.now() - first.quiet_since).total_seconds()) < 5  # the clock starts

    last_busy(worker, 300)
    beat(client, worker, agent, QUIET)  # quiet: "last busy" stays where it was
    assert state(worker).idle_for(timezone.now()) == pytest.approx(300, abs=5)

    beat(client, worker, agent, BUSY)
    busy = state(worker)
    assert busy.cpu == pytest.approx(0.975)
    assert busy.idle_for(timezone.now()) == 0.0


@pytest.mark.parametrize(
    "report",
    [
        {"span": "0", "cpu": "1", "io": "0"},
        {"span": "10", "cpu": "-1", "io": "0"},
        {"span": "10", "cpu": "nan", "io": "0"},
        {"span": "10", "cpu": "1", "io": "0", "sessions": "NOT AN ID:1:2"},
        {"span": "10", "cpu": "1", "io": "0", "sessions": ",".join(["s1:0:0"] * 31)},
    ],
)
def test_a_malformed_report_is_refused_but_its_beat_counts(
    client: Client, report: dict[str, str]
) -> None:
    worker, agent = connected(client)
    redis_client().delete(f"activate:hb:{worker.pk}")
    status, answer, signed = django_post(
        client, agent, "heartbeat", {"worker": worker.public_id, **report}
    )
    assert (status, signed) == (200, True)
    assert answer["activity_error"].split(":")[0] in {"span", "cpu", "sessions"}, answer
    assert redis_client().exists(f"activate:hb:{worker.pk}")  # alive all the same
    assert not state(worker).measured


def test_idle_warns_with_keep_then_deletes_with_its_reason(
    client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    worker, agent = connected(client)
    beat(client, worker, agent, QUIET)
    last_busy(worker, 100)  # warned from 90 s on (2 min less 30 s)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeps.sweep_idle_workers(now)["warn"] == 1
        assert sweeps.sweep_idle_workers(now)["warn"] == 0  # once

    [message] = [m for m in mail.outbox if "idle" in m.subject]
    assert message.subject.startswith(f"Worker {worker.name} is idle: it is deleted at")
    client.force_login(worker.owner)
    [shown] = [n for n in client.get("/notices/feed/").json()["notices"] if n["kind"] == "idle"]
    assert shown["keep"] == f"/workers/{worker.public_id}/keep/"
    api = client.get(f"/api/workers/{worker.public_id}/").json()
    assert api["idle_warned_at"] is not None and api["idle_since"] is not None

    # 31 s later, still quiet: deleted, with the reason shown.
    with django_capture_on_commit_callbacks(execute=True):
        done = sweeps.sweep_idle_workers(now + timedelta(seconds=31))
    assert done["end"] == 1
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPING
    assert worker.status_reason == "Deleted after 2 minutes idle"


def test_keep_resets_the_clock_and_takes_the_warning_back(
    client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    worker, agent = connected(client)
    beat(client, worker, agent, QUIET)
    last_busy(worker, 100)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeps.sweep_idle_workers(now)["warn"] == 1
    client.force_login(worker.owner)

    answer = client.post(
        f"/workers/{worker.public_id}/keep/", headers={"Accept": "application/json"}
    )

    assert answer.status_code == 200
    assert not Notice.objects.filter(kind=NoticeKind.IDLE).exists()
    worker.refresh_from_db()
    assert worker.idle_warned_at is None and worker.idle_kept_at is not None
    later = now + timedelta(seconds=31)
    assert sweeps.sweep_idle_workers(later) == {"warn": 0, "end": 0, "clear": 0}
    assert worker.status == WorkerStatus.CONNECTED
    # The clock runs again from Keep: warned once more 90 s after it.
    beat(client, worker, agent, QUIET)
    Worker.objects.filter(pk=worker.pk).update(idle_kept_at=timezone.now() - timedelta(seconds=95))
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeps.sweep_idle_workers(timezone.now())["warn"] == 1
    assert Notice.objects.filter(kind=NoticeKind.IDLE).count() == 1


def test_busy_again_after_the_warning_takes_it_back(
    client: Client, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    worker, agent = connected(client)
    beat(client, worker, agent, QUIET)
    last_busy(worker, 100)
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeps.sweep_idle_workers(timezone.now())["warn"] == 1
    beat(client, worker, agent, BUSY)
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeps.sweep_idle_workers(timezone.now())["clear"] == 1
    assert not Notice.objects.filter(kind=NoticeKind.IDLE).exists()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.CONNECTED and worker.idle_warned_at is None


def test_an_open_terminal_or_session_traffic_keeps_a_quiet_job_busy(client: Client) -> None:
    worker, agent = connected(client)
    beat(client, worker, agent, QUIET)
    last_busy(worker, 500)
    assert state(worker).idle_for(timezone.now()) == pytest.approx(500, abs=5)

    terminal = TerminalRecord.objects.create(
        worker=worker, worker_public_id=worker.public_id, user=worker.owner
    )
    assert state(worker).quiet_since is None
    TerminalRecord.objects.filter(pk=terminal.pk).update(closed_at=timezone.now())
    assert state(worker).idle_for(timezone.now()) == pytest.approx(500, abs=5)

    idle.note_traffic(worker.pk, "sabc")  # a proxied request for one of its sessions
    assert state(worker).idle_for(timezone.now()) == 0.0
    assert idle.session_quiet_since(worker.pk, ["sabc"])["sabc"] is not None


def test_no_policy_or_no_reports_never_deletes(client: Client, sent: list[Any]) -> None:
    unmeasured, _ = connected(client)
    last_busy(unmeasured, 10_000)
    off, agent = connected(client, minutes=None)
    beat(client, off, agent, QUIET)
    last_busy(off, 10_000)
    later = timezone.now() + timedelta(hours=1)
    assert sweeps.sweep_idle_workers(later) == {"warn": 0, "end": 0, "clear": 0}
    assert sweeps.sweep_idle_workers(timezone.now()) == {"warn": 0, "end": 0, "clear": 0}


@pytest.mark.parametrize(
    ("idle_for", "warned_ago", "expected"),
    [
        (89, None, "wait"),
        (90, None, "warn"),
        (125, None, "warn"),  # past the policy but never warned: warned first
        (125, 29, "wait"),  # warned, but not a whole lead ago
        (125, 30, "end"),
        (100, 5, "wait"),
        (10, 5, "clear"),
    ],
)
def test_the_policy_decides_from_quiet_time_and_warning(
    idle_for: float, warned_ago: float | None, expected: str
) -> None:
    now = timezone.now()
    warned = None if warned_ago is None else now - timedelta(seconds=warned_ago)
    assert idle.decide(idle_for, 120.0, warned, now) == expected
    assert idle.decide(idle_for, None, warned, now) == "wait"


def test_a_policy_shorter_than_the_sites_shortest_is_refused_at_request(
    api: Any, compute_env: Any
) -> None:
    body = {
        "cluster": compute_env.cluster.name,
        "environment": compute_env.name,
        "params": {"account": "proj-1"},
    }
    short = api.post("/api/workers/", {**body, "idle_minutes": 0.5}, format="json")
    assert short.status_code == 400
    assert short.json()["field"] == "idle_minutes"
    assert "at least 1 minutes" in short.json()["detail"]
    assert not Worker.objects.exists()
    compute_env.idle_minutes = 45
    compute_env.save()
    default = api.post("/api/workers/", body, format="json")
    off = api.post("/api/workers/", {**body, "idle_minutes": 0}, format="json")
    assert default.status_code == 201, default.json()
    assert (default.json()["idle_minutes"], off.json()["idle_minutes"]) == (45.0, None)

"""Sweeps on a queue and a Celery worker of their own; beat on every host with one sending at a
time (the lease in Redis); sweep lag in /health/. Against the tests' real Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from django.test import Client

from activate.celery import app
from core import beat, sweep_lag
from core.beat import BeatLease, LeasedScheduler, lease_key
from core.redis_connection import redis_client
from harness.platform import Platform
from harness.waiting import wait_until
from workers_app import tasks

LEASE = 1.0


class RecordingScheduler(LeasedScheduler):
    """The leased scheduler, its sends recorded instead of published."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[float] = []
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        self.sent.append(time.monotonic())


@pytest.fixture
def beat_app() -> Celery:
    """A Celery app whose schedule is one entry due every 0.1 s."""
    beat = Celery("lease-test", broker=settings.REDIS_URL, set_as_current=False)
    beat.conf.beat_schedule = {"probe": {"task": "probe", "schedule": 0.1}}
    return beat


@pytest.fixture
def schedulers(beat_app: Celery, tmp_path: Path, settings: Any) -> Iterator[list[Any]]:
    settings.ACTIVATE_BEAT_LEASE = LEASE
    made = [
        RecordingScheduler(app=beat_app, schedule_filename=str(tmp_path / f"beat{i}"))
        for i in (1, 2)
    ]
    yield made
    for scheduler in made:
        scheduler.close()


def tick(schedulers: list[Any], seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for scheduler in schedulers:
            scheduler.tick()
        time.sleep(0.02)


def test_of_two_beats_only_the_lease_holder_sends(schedulers: list[Any]) -> None:
    first, second = schedulers
    tick(schedulers, 1.0)
    assert first.holding and not second.holding
    assert len(first.sent) >= 5
    assert second.sent == []
    assert redis_client().get(lease_key()) == first.lease.fence.encode()


def test_the_standby_takes_over_within_a_lease_when_the_holder_dies(
    schedulers: list[Any],
) -> None:
    first, second = schedulers
    tick(schedulers, 0.5)
    assert first.holding
    # The holder dies: it neither ticks nor releases anything.
    died = time.monotonic()
    tick([second], LEASE + 0.5)
    assert second.sent, "the standby never sent"
    took = second.sent[0] - died
    assert took < LEASE
    # Its lease was still running for the standby's first asks.
    assert took >= 0.5 * LEASE


def test_the_settings_keep_a_sweep_interval_below_the_gap_between_two_holders_sends() -> None:
    # settings/base.py cannot import core.beat; the share it checks must match beat.py's.
    source = (Path(__file__).parents[2] / "activate" / "settings" / "base.py").read_text()
    gap = beat.KEY_SHARE - beat.RENEW_SHARE
    assert f"{gap:g} * ACTIVATE_BEAT_LEASE" in source


def test_a_clean_exit_releases_the_lease_at_once(schedulers: list[Any]) -> None:
    first, second = schedulers
    tick(schedulers, 0.3)
    first.close()
    closed = time.monotonic()
    tick([second], 0.5)
    assert second.sent and second.sent[0] - closed < 0.3


def test_with_the_lease_off_every_beat_sends(
    beat_app: Celery, tmp_path: Path, settings: Any
) -> None:
    settings.ACTIVATE_BEAT_LEASE = 0
    both = [
        RecordingScheduler(app=beat_app, schedule_filename=str(tmp_path / f"beat{i}"))
        for i in (1, 2)
    ]
    tick(both, 0.5)
    assert all(s.sent for s in both)
    assert redis_client().get(lease_key()) is None


def test_a_lease_is_renewed_and_released_only_with_its_own_token() -> None:
    holder = BeatLease(redis_client(), lease_key(), LEASE, token="holder")
    other = BeatLease(redis_client(), lease_key(), LEASE, token="other")
    assert holder.hold()
    assert not other.hold()
    assert not other.release()
    assert holder.holder() == holder.fence
    assert holder.hold() and holder.held()
    assert holder.release()
    assert holder.holder() is None
    assert other.hold()


def test_a_lapsed_lease_goes_to_whoever_asks_first() -> None:
    holder = BeatLease(redis_client(), lease_key(), 0.3, token="holder")
    other = BeatLease(redis_client(), lease_key(), 0.3, token="other")
    assert holder.hold()
    time.sleep(0.4)
    assert not holder.held()
    assert other.hold()
    assert not holder.hold()


def test_sweep_tasks_go_to_the_sweeps_queue_and_the_rest_to_the_workers_queue() -> None:
    def queue(task: str) -> str:
        return str(app.amqp.router.route({}, task)["queue"].name)

    sweeps = [e["task"] for n, e in settings.CELERY_BEAT_SCHEDULE.items() if n.startswith("sweep")]
    assert len(sweeps) == 6
    assert {queue(task) for task in sweeps} == {"sweeps"}
    for task in (
        "workers_app.tasks.poll_clusters",
        "workers_app.tasks.poll_cluster",
        "workers_app.tasks.submit_workers",
        "workers_app.tasks.dispatch_pending",
        "sessions_app.tasks.start_session",
    ):
        assert queue(task) == "celery", task


@pytest.mark.live
def test_only_the_sweeper_runs_sweeps(transactional_db: None, tmp_path: Path) -> None:
    """A sweep sent while only the ordinary worker runs waits for the sweeper."""
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_worker()
        tasks.sweep_timeouts.delay()
        tasks.poll_clusters.delay()
        assert wait_until(lambda: platform.log_count("poll_clusters") >= 2, timeout=30)
        time.sleep(2)
        assert sweep_lag.sweep_lag()["timeouts"] is None
        assert redis_client().llen("sweeps") == 1
        platform.start_sweeper()
        assert wait_until(lambda: sweep_lag.sweep_lag()["timeouts"] is not None, timeout=30)
        assert platform.log_count("sweep_timeouts") >= 2
    finally:
        platform.stop_all()


@pytest.mark.django_db
def test_health_reports_each_sweeps_lag_without_failing_on_it(client: Client) -> None:
    now = time.time()
    sweep_lag.note_completed("heartbeats", at=now - 2.5)
    sweep_lag.note_completed("timeouts", at=now - 3600)
    answer = client.get("/health/")
    assert answer.status_code == 200
    lag = answer.json()["sweep_lag"]
    assert set(lag) == set(sweep_lag.KINDS)
    assert 2.5 <= lag["heartbeats"] < 10
    assert lag["timeouts"] >= 3600
    assert lag["sessions"] is None


def test_a_completed_sweep_task_notes_its_completion(db: None) -> None:
    assert sweep_lag.sweep_lag()["heartbeats"] is None
    tasks.sweep_heartbeats()
    assert sweep_lag.sweep_lag()["heartbeats"] == 0.0

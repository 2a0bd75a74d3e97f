"""Durations in the Workers table: wall time formats and what is left of it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workers_app.models import Worker
from workers_app.pages.rows import in_words, time_left, walltime_seconds
from workers_app.statuses import WorkerStatus


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("04:00:00", 4 * 3600),
        ("30", 30 * 60),
        ("30:15", 30 * 60 + 15),
        ("1-12", 36 * 3600),
        ("2-03:30", (51 * 60 + 30) * 60),
        ("1-00:00:10", 86410),
        ("4 hours", None),
        ("", None),
    ],
)
def test_walltime_reads_the_schedulers_formats(value: str, seconds: int | None) -> None:
    assert walltime_seconds(value) == seconds


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(-5, "0s"), (45, "45s"), (600, "10m"), (3 * 3600 + 720, "3h 12m"), (50 * 3600, "2d 2h")],
)
def test_durations_in_words(seconds: float, words: str) -> None:
    assert in_words(seconds) == words


def test_time_left_counts_from_the_jobs_start_and_waits_before_it() -> None:
    now = timezone.now()
    worker = Worker(params={"walltime": "01:00:00"}, status=WorkerStatus.QUEUED)
    assert time_left(worker, now) == "1h 0m once started"

    worker.status, worker.started_at = WorkerStatus.CONNECTED, now - timedelta(minutes=15)
    assert time_left(worker, now) == "45m left"

    worker.started_at = now - timedelta(hours=2)
    assert time_left(worker, now) == "ending"

    worker.status = WorkerStatus.STOPPED
    assert time_left(worker, now) == ""
    assert time_left(Worker(params={}, status=WorkerStatus.CONNECTED), now) == ""

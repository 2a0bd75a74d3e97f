"""Durations in the Workers table: what is left of the wall time, read as the worker's
scheduler writes it (the formats themselves: tests/schedulers/test_adapter_knowledge.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workers_app.models import Cluster, Worker
from workers_app.pages.rows import in_words, time_left
from workers_app.statuses import WorkerStatus


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(-5, "0s"), (45, "45s"), (600, "10m"), (3 * 3600 + 720, "3h 12m"), (50 * 3600, "2d 2h")],
)
def test_durations_in_words(seconds: float, words: str) -> None:
    assert in_words(seconds) == words


def test_time_left_counts_from_the_jobs_start_and_waits_before_it() -> None:
    now = timezone.now()
    slurm = Cluster(scheduler="slurm")
    worker = Worker(cluster=slurm, params={"walltime": "01:00:00"}, status=WorkerStatus.QUEUED)
    assert time_left(worker, now) == "1h 0m once started"

    worker.status, worker.started_at = WorkerStatus.CONNECTED, now - timedelta(minutes=15)
    assert time_left(worker, now) == "45m left"

    worker.started_at = now - timedelta(hours=2)
    assert time_left(worker, now) == "ending"

    worker.status = WorkerStatus.STOPPED
    assert time_left(worker, now) == ""
    assert time_left(Worker(cluster=slurm, params={}, status=WorkerStatus.CONNECTED), now) == ""


@pytest.mark.parametrize(("scheduler", "left"), [("slurm", "1h 30m"), ("pbs", "1m")])
def test_time_left_reads_the_wall_time_as_the_workers_scheduler_does(
    scheduler: str, left: str
) -> None:
    # "90" is minutes to sbatch --time and seconds to PBS's walltime.
    worker = Worker(
        cluster=Cluster(scheduler=scheduler), params={"walltime": "90"}, status=WorkerStatus.QUEUED
    )
    assert time_left(worker, timezone.now()) == f"{left} once started"

"""When a worker's job must end: its wall time, read as its scheduler writes it."""

from __future__ import annotations

from datetime import datetime, timedelta

from schedulers import adapter_class
from workers_app.models import Worker


def limit_of(worker: Worker) -> int | None:
    """Seconds of wall time the worker asked for (Slurm's "30" is minutes, PBS's seconds)."""
    return adapter_class(worker.cluster.scheduler).parse_walltime(
        str(worker.params.get("walltime", ""))
    )


def ends_at(worker: Worker) -> datetime | None:
    """When the scheduler ends the job: its start plus its wall time (None: not known)."""
    limit = limit_of(worker)
    started = worker.started_at or worker.connected_at
    if limit is None or started is None:
        return None
    return started + timedelta(seconds=limit)

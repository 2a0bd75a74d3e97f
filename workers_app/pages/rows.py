"""What a row of the Workers table shows: durations in words, the wall time left."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from workers_app import idle, walltime
from workers_app.models import Worker
from workers_app.statuses import FINISHED, WorkerStatus

# Statuses whose job holds a node, so its wall time is running out.
RUNNING = frozenset({WorkerStatus.STARTING, WorkerStatus.CONNECTED, WorkerStatus.STOPPING})


def in_words(seconds: float) -> str:
    """A short duration: ``45s``, ``12m``, ``3h 12m``, ``2d 4h``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


@dataclass(frozen=True)
class WorkerRow:
    worker: Worker
    age: str
    time_left: str
    # Names of terminals kept on its node (tmux) that its owner opened.
    kept_terminals: tuple[str, ...] = ()
    # How long nothing has run or been used on it ("" when busy or not measured).
    idle_for: str = ""

    @property
    def ssh_command(self) -> str:
        return f"pw ssh {self.worker.public_id}"

    @property
    def environment_name(self) -> str:
        environment = self.worker.environment
        return environment.name if environment is not None else ""

    @classmethod
    def of(
        cls,
        worker: Worker,
        now: datetime,
        kept: Iterable[str] = (),
        idleness: idle.Idleness | None = None,
    ) -> WorkerRow:
        quiet = idleness.idle_for(now) if idleness is not None else 0.0
        return cls(
            worker=worker,
            age=in_words((now - worker.created_at).total_seconds()),
            time_left=time_left(worker, now),
            kept_terminals=tuple(sorted(kept)),
            idle_for=in_words(quiet) if quiet > 0 else "",
        )


def time_left(worker: Worker, now: datetime) -> str:
    """``3h 12m left`` for a job holding a node; the requested wall time while it waits."""
    if worker.status in FINISHED:
        return ""
    limit = walltime.limit_of(worker)
    if limit is None:
        return ""
    ends = walltime.ends_at(worker)
    if worker.status not in RUNNING or ends is None:
        return f"{in_words(limit)} once started"
    remaining = (ends - now).total_seconds()
    return f"{in_words(remaining)} left" if remaining > 0 else "ending"

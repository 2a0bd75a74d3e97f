"""Scheduler adapters behind one interface (base.py); the SSH transport they run over (ssh.py)."""

from __future__ import annotations

from workers_app.schedulers.base import SchedulerAdapter
from workers_app.schedulers.gridengine import GridEngineAdapter
from workers_app.schedulers.host import HostAdapter
from workers_app.schedulers.pbs import PbsAdapter
from workers_app.schedulers.slurm import SlurmAdapter

ADAPTERS: dict[str, type[SchedulerAdapter]] = {
    "slurm": SlurmAdapter,
    "pbs": PbsAdapter,
    "gridengine": GridEngineAdapter,
    "host": HostAdapter,
}


def adapter_class(kind: str) -> type[SchedulerAdapter]:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown scheduler kind {kind!r}") from None

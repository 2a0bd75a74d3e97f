"""Scheduler adapters behind one interface, and the SSH transport they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers_app.schedulers.base import SchedulerAdapter

if TYPE_CHECKING:
    from workers_app.models import Cluster


def adapter_class(kind: str) -> type[SchedulerAdapter]:
    from workers_app.schedulers.host import HostAdapter
    from workers_app.schedulers.pbs import PbsAdapter
    from workers_app.schedulers.slurm import SlurmAdapter

    classes: dict[str, type[SchedulerAdapter]] = {
        "slurm": SlurmAdapter,
        "pbs": PbsAdapter,
        "host": HostAdapter,
    }
    try:
        return classes[kind]
    except KeyError:
        raise ValueError(f"unknown scheduler kind {kind!r}") from None


def adapter_for(cluster: Cluster) -> SchedulerAdapter:
    from workers_app.schedulers.ssh import connection_for

    return adapter_class(cluster.scheduler)(connection_for(cluster))

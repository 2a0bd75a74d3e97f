"""Where a worker's job runs: the node its scheduler reports, never what its agent says.

Sessions, terminals and the session proxy connect to ``Worker.node_hostname`` with the owner's
credentials and fill in programs' passwords there, so it must come from the scheduler: anyone
holding (or having captured) a worker's secret could otherwise point them at any host.
"""

from __future__ import annotations

from core.transport.errors import SSHError
from schedulers.base import Phase, QueryFailed, SchedulerError
from workers_app.actions import lifecycle
from workers_app.cluster_access import adapter_for_worker
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus


class NodeUnknown(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def scheduler_node(worker: Worker) -> str:
    """The node the scheduler runs the worker's job on. Asked when the poll has not seen the job
    running yet; NodeUnknown (409 or 503, which agents retry) while the scheduler does not say."""
    if worker.status == WorkerStatus.STARTING and worker.node_hostname:
        return worker.node_hostname
    try:
        adapter = adapter_for_worker(worker)
        info = adapter.query([worker.scheduler_job_id]).get(worker.scheduler_job_id)
    except (SSHError, QueryFailed, SchedulerError) as exc:
        raise NodeUnknown(503, f"the scheduler cannot be asked now: {exc}") from exc
    if info is None or info.phase is not Phase.RUNNING or not info.node:
        raise NodeUnknown(409, "the scheduler does not show the job running yet")
    return info.node


def note_claimed_host(worker: Worker, *, claimed: str, node: str) -> None:
    """An agent that names another host than the scheduler's node is noted in the worker's
    history, where operators see it; it changes nothing else."""
    if not same_host(claimed, node):
        lifecycle.record_event(
            worker, f"Its agent says it runs on {claimed}; the scheduler's node {node} is used"
        )


def same_host(claimed: str, node: str) -> bool:
    """Slurm's and PBS's node names are usually the short host name."""
    return claimed.split(".")[0].lower() == node.split(".")[0].lower()

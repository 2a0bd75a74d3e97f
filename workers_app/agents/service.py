"""What happens when a node agent calls back: connect once, then cheap heartbeats."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.utils import timezone

from workers_app import lifecycle
from workers_app.agents.heartbeats import AgentIdentity, Beat, Beaten, HeartbeatStore
from workers_app.models import Worker, hash_secret
from workers_app.statuses import WorkerStatus

S = WorkerStatus
# The database keeps a coarse "last seen" for display; Redis has the exact liveness.
LAST_SEEN_GRANULARITY = 60


class AgentRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _authenticate(worker: Worker | None, secret: str) -> Worker:
    # Same answer for "no such worker" and "wrong secret": ids cannot be probed.
    if worker is None or not worker.agent_secret_hash:
        raise AgentRefused(403, "forbidden")
    if not hmac.compare_digest(worker.agent_secret_hash, hash_secret(secret)):
        raise AgentRefused(403, "forbidden")
    return worker


def connect_agent(public_id: str, secret: str, *, hostname: str, job_id: str) -> float:
    worker = _authenticate(Worker.objects.filter(public_id=public_id).first(), secret)
    store = HeartbeatStore()
    # The key exists before the status says connected, so no sweep can see one without the other.
    store.beat(worker.pk)
    if worker.status in (S.QUEUED, S.STARTING):
        lifecycle.mark_connected(worker, hostname=hostname, job_id=job_id)
    if worker.status == S.PENDING:
        # The job started before its submission was recorded; the agent asks again shortly.
        raise AgentRefused(409, "worker is not submitted yet")
    if worker.status != S.CONNECTED:
        raise AgentRefused(410, f"worker is {worker.status}")
    store.remember_agent(public_id, AgentIdentity(worker.pk, worker.agent_secret_hash))
    return settings.ACTIVATE_HEARTBEAT_INTERVAL


def record_heartbeat(public_id: str, secret: str) -> None:
    store = HeartbeatStore()
    secret_hash = hash_secret(secret)
    beat = store.beat_agent(public_id, secret_hash, seen_window=LAST_SEEN_GRANULARITY)
    if beat is Beat.UNKNOWN:
        worker = _authenticate(Worker.objects.filter(public_id=public_id).first(), secret)
        if worker.status in (S.QUEUED, S.STARTING):
            raise AgentRefused(409, "connect first")
        if worker.status != S.CONNECTED:
            raise AgentRefused(410, f"worker is {worker.status}")
        store.remember_agent(public_id, AgentIdentity(worker.pk, worker.agent_secret_hash))
        beat = store.beat_agent(public_id, secret_hash, seen_window=LAST_SEEN_GRANULARITY)
    if not isinstance(beat, Beaten):
        raise AgentRefused(403, "forbidden")
    if beat.first_in_window:
        note_seen(beat.worker_id)


def note_seen(worker_id: int) -> None:
    """The coarse "last seen" the database keeps (a beat's first in LAST_SEEN_GRANULARITY)."""
    Worker.objects.filter(pk=worker_id).update(last_heartbeat_at=timezone.now())

"""What happens when a node agent calls back: connect once, then cheap heartbeats.

A beat is one Redis round trip (agents/beats.py); the agents' server makes it on its event loop
(agents/asgi.py), Django's view through ``record_heartbeat``. Both come here for what needs the
database: an agent whose identity is not cached (``beat_uncached``) and the "last seen" time.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.utils import timezone

from agents.activity import ActivityReport
from agents.beats import AgentBeats, AgentIdentity, Beaten, Nonce, accepted
from agents.errors import AgentRefused
from agents.nodes import NodeUnknown, note_claimed_host, scheduler_node
from workers_app import signals
from workers_app.actions import lifecycle
from workers_app.liveness import Liveness
from workers_app.models import Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
# The database keeps a coarse "last seen" for display; Redis has the exact liveness.
LAST_SEEN_GRANULARITY = 60


def _authenticate(worker: Worker | None, key_hash: str) -> Worker:
    # Same answer for "no such worker" and "an older attempt's key": ids cannot be probed.
    if worker is None or not worker.agent_secret_hash:
        raise AgentRefused(403, "forbidden")
    if not hmac.compare_digest(worker.agent_secret_hash, key_hash):
        raise AgentRefused(403, "forbidden")
    return worker


def connect_agent(public_id: str, key_hash: str, *, hostname: str, job_id: str) -> float:
    worker = _authenticate(Worker.objects.filter(public_id=public_id).first(), key_hash)
    # The key exists before the status says connected, so no sweep can see one without the other.
    Liveness().beat(worker.pk)
    if worker.status in (S.QUEUED, S.STARTING):
        try:
            node = scheduler_node(worker)
        except NodeUnknown as exc:
            raise AgentRefused(exc.status, exc.message) from exc
        if lifecycle.mark_connected(worker, hostname=node, job_id=job_id):
            note_claimed_host(worker, claimed=hostname, node=node)
    if worker.status == S.PENDING:
        # The job started before its submission was recorded; the agent asks again shortly.
        raise AgentRefused(409, "worker is not submitted yet")
    if worker.status != S.CONNECTED:
        raise AgentRefused(410, f"worker is {worker.status}")
    AgentBeats().remember_agent(public_id, AgentIdentity(worker.pk, worker.agent_secret_hash))
    return settings.ACTIVATE_HEARTBEAT_INTERVAL


def _beat(
    public_id: str,
    key_hash: str,
    *,
    nonce: Nonce | None = None,
    activity: ActivityReport | None = None,
) -> Beaten | None:
    """One run of the beat script; None while the agent's identity is not cached."""
    beats = AgentBeats()
    call = beats.beat_arguments(
        public_id, key_hash, seen_window=LAST_SEEN_GRANULARITY, nonce=nonce, activity=activity
    )
    beaten = accepted(beats.beat_agent(call))
    if beaten is not None and beaten.first_in_window:
        note_seen(beaten.worker_id)
    return beaten


def record_heartbeat(
    public_id: str,
    key_hash: str,
    *,
    nonce: Nonce | None = None,
    activity: ActivityReport | None = None,
) -> None:
    """A beat from the agent whose key hashes to ``key_hash``, with the activity report it
    carries if any, in one synchronous call. With ``nonce`` the beat is done only if the nonce
    is new; without, the caller has already remembered it."""
    if _beat(public_id, key_hash, nonce=nonce, activity=activity) is None:
        beat_uncached(public_id, key_hash, activity=activity)


def beat_uncached(public_id: str, key_hash: str, *, activity: ActivityReport | None = None) -> None:
    """A beat whose agent's identity is not cached (its first after a connect, a Redis reset):
    the database says whether the key is the worker's own; if so the identity is cached and the
    beat done (its nonce was remembered already)."""
    worker = _authenticate(Worker.objects.filter(public_id=public_id).first(), key_hash)
    if worker.status in (S.QUEUED, S.STARTING):
        raise AgentRefused(409, "connect first")
    if worker.status != S.CONNECTED:
        raise AgentRefused(410, f"worker is {worker.status}")
    AgentBeats().remember_agent(public_id, AgentIdentity(worker.pk, worker.agent_secret_hash))
    if _beat(public_id, key_hash, activity=activity) is None:
        raise AgentRefused(403, "forbidden")


def note_seen(worker_id: int) -> None:
    """The coarse "last seen" the database keeps (a beat's first in LAST_SEEN_GRANULARITY)."""
    note_seen_many([worker_id])


def note_seen_many(worker_ids: list[int]) -> None:
    """``note_seen`` for several workers in one statement."""
    Worker.objects.filter(pk__in=worker_ids).update(last_heartbeat_at=timezone.now())


def report_sessions_ended(public_id: str, key_hash: str, session_ids: list[str]) -> None:
    """The agent saw these sessions' launchers end on its node: whoever follows sessions ends
    those of this worker that are still running (another worker's ids are not its to end)."""
    worker = _authenticate(Worker.objects.filter(public_id=public_id).first(), key_hash)
    if session_ids:
        signals.agent_sessions_ended.send(sender=Worker, worker=worker, session_ids=session_ids)

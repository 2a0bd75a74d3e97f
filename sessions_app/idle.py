"""Idle sessions: how long each running session has been quiet, the owner's Keep, and the sweep
that warns owners and then ends the sessions (workers_app.idle measures and owns the policy)."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import User
from django.utils import timezone

from sessions_app.models import Session
from sessions_app.services import stop_session
from sessions_app.statuses import SessionStatus
from workers_app import idle
from workers_app.actions import NotOwner


def keep_session(session: Session, *, owner: User) -> None:
    """Keep: the session's idle clock starts again now, and any warning is taken back."""
    if session.owner_id != owner.pk:
        raise NotOwner("only the session's owner can keep it")
    idle.reset_idle(session, kept_at=timezone.now())


def session_idleness(sessions: list[Session], now: datetime) -> dict[int, float | None]:
    """Seconds each running session has been quiet (None: not measured), by its own traffic
    and processes; its worker's agent must be reporting."""
    workers = {s.worker_id: s.worker for s in sessions}
    measured = idle.idleness_of(list(workers.values()), now)
    found: dict[int, float | None] = {}
    by_worker: dict[int, list[Session]] = {}
    for session in sessions:
        by_worker.setdefault(session.worker_id, []).append(session)
    for worker_id, on_worker in by_worker.items():
        state = measured.get(worker_id)
        if state is None or not state.measured:
            found.update({s.pk: None for s in on_worker})
            continue
        busy = idle.session_quiet_since(worker_id, [s.public_id for s in on_worker])
        for session in on_worker:
            marks = [busy.get(session.public_id), session.started_at, session.idle_kept_at]
            since = max(m for m in marks if m is not None)
            found[session.pk] = idle.Idleness(True, since).idle_for(now)
    return found


def apply_policy(session: Session, idle_for: float, now: datetime) -> str | None:
    """The idle sweep's step for one running session quiet ``idle_for`` seconds: warn, end it
    (and a dedicated worker with it), or take the warning back. Returns what it did, or None."""
    if session.idle_minutes is None:
        return None
    policy = idle.policy_seconds(session.idle_minutes)
    decision = idle.decide(idle_for, policy, session.idle_warned_at, now)
    if decision == idle.Decision.WARN:
        done = idle.warn_idle(session, now, live=SessionStatus.RUNNING)
    elif decision == idle.Decision.CLEAR:
        done = idle.reset_idle(session)
    elif decision == idle.Decision.END:
        done = stop_session(
            session,
            reason=idle.idle_reason(session.idle_minutes, what="Ended"),
            worker_reason=idle.idle_reason(session.idle_minutes),
        )
    else:
        return None
    return decision if done else None


def sweep_idle_sessions(now: datetime | None = None) -> dict[str, int]:
    """Warn the owners of sessions idle nearly as long as their policy, end those past it,
    and take back the warnings of those busy again."""
    now = now or timezone.now()
    done = {idle.Decision.WARN: 0, idle.Decision.END: 0, idle.Decision.CLEAR: 0}
    sessions = list(
        Session.objects.filter(status=SessionStatus.RUNNING, idle_minutes__gt=0).select_related(
            "worker", "worker__cluster", "owner"
        )
    )
    quiet = session_idleness(sessions, now)
    for session in sessions:
        idle_for = quiet.get(session.pk)
        did = None if idle_for is None else apply_policy(session, idle_for, now)
        if did is not None:
            done[did] += 1
    return done

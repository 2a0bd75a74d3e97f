"""Idle workers: quiet since when, as measured on the node and seen by the platform, and the
policy that warns their owners and then deletes them.

A worker is busy when its job's processes used CPU or I/O over the agent's last report span
(agents.activity), when a terminal is open on it, or when a session on it carried traffic
through the proxy. It is *measured* only while its agent's reports arrive: a worker whose agent
does not report (an older agent, a Redis that lost its data) is never judged idle.

The one owner of workers' idleness: the measure, the policy, the warnings (sent as
``signals.idle_warning``; notices_app listens), Keep, and the idle sweep's step for one worker.
Sessions' idleness is ``sessions_app.idle``, on top of this.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from core.redis_connection import redis_client
from workers_app import signals
from workers_app.actions import NotOwner
from workers_app.actions.deletion import delete_worker
from workers_app.models import Environment, TerminalRecord, Worker
from workers_app.models.idle import IdlePolicy
from workers_app.statuses import WorkerStatus

log = logging.getLogger(__name__)

# Activity: ACTIVITY_PREFIX<worker> holds when it was last busy (epoch seconds), ...:r its last
# report ("at;share of a core;bytes a second"), ...:s:<session> when that session was last busy.
# The agents' server writes them with a beat that carries a report (agents/beats.py).
ACTIVITY_PREFIX = "activate:act:"
ACTIVITY_TTL = 8 * 86400

# Traffic is noted at most this often per worker or session and process (and well within the
# grace): a proxied download touches Redis a few times a minute, not once a chunk.
NOTE_EVERY = 10.0
_noted: dict[str, float] = {}


@dataclass(frozen=True)
class Idleness:
    measured: bool  # the agent's reports arrive
    quiet_since: datetime | None  # None: busy now, or not measured
    cpu: float | None = None  # the last report's share of a core
    io: float | None = None  # and bytes a second

    def idle_for(self, now: datetime) -> float:
        """Seconds quiet, counted only past the grace a busy worker's next report may take."""
        if self.quiet_since is None:
            return 0.0
        quiet = (now - self.quiet_since).total_seconds()
        return quiet if quiet > grace() else 0.0


def grace() -> float:
    """How long a busy worker may go without a new "busy": one report span and a beat."""
    return settings.ACTIVATE_ACTIVITY_INTERVAL + settings.ACTIVATE_HEARTBEAT_INTERVAL


def _epoch(value: bytes | str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (ValueError, OverflowError):
        return None


def _report(value: bytes | str | None) -> tuple[datetime, float, float] | None:
    if value is None:
        return None
    try:
        text = value.decode() if isinstance(value, bytes) else value
        at, cpu, io = text.split(";")
        return datetime.fromtimestamp(float(at), tz=UTC), float(cpu), float(io)
    except (ValueError, OverflowError, UnicodeDecodeError):
        return None


def _terminal_open(worker_ids: Sequence[int], now: datetime) -> set[int]:
    oldest = now - timedelta(seconds=settings.ACTIVATE_TERMINAL_MAX_DURATION)
    return set(
        TerminalRecord.objects.filter(
            worker_id__in=worker_ids, closed_at__isnull=True, opened_at__gte=oldest
        ).values_list("worker_id", flat=True)
    )


def idleness_of(workers: Sequence[Worker], now: datetime | None = None) -> dict[int, Idleness]:
    """How idle each connected worker is (one Redis round trip, one query); others are not."""
    now = now or timezone.now()
    connected = [w for w in workers if w.status == WorkerStatus.CONNECTED]
    if not connected:
        return {}
    keys: list[str] = []
    for worker in connected:
        keys += [f"{ACTIVITY_PREFIX}{worker.pk}", f"{ACTIVITY_PREFIX}{worker.pk}:r"]
    try:
        values = redis_client().mget(keys)
    except RedisError as exc:
        log.warning("activity not read, Redis did not answer: %s", exc)
        return {w.pk: Idleness(measured=False, quiet_since=None) for w in connected}
    terminals = _terminal_open([w.pk for w in connected], now)
    fresh = timedelta(seconds=2 * grace())
    found = {}
    for at, worker in enumerate(connected):
        busy_at, report = _epoch(values[2 * at]), _report(values[2 * at + 1])
        if report is None or now - report[0] > fresh:
            found[worker.pk] = Idleness(measured=False, quiet_since=None)
            continue
        since = None
        if worker.pk not in terminals:
            marks = [busy_at, worker.connected_at, worker.idle_kept_at]
            since = max(m for m in marks if m is not None)
        found[worker.pk] = Idleness(True, since, cpu=report[1], io=report[2])
    return found


def session_quiet_since(worker_id: int, session_ids: Sequence[str]) -> dict[str, datetime | None]:
    """When each session on a worker was last busy (its processes, or its proxied traffic)."""
    if not session_ids:
        return {}
    keys = [f"{ACTIVITY_PREFIX}{worker_id}:s:{session}" for session in session_ids]
    try:
        values = redis_client().mget(keys)
    except RedisError as exc:
        log.warning("session activity not read, Redis did not answer: %s", exc)
        return {}
    return {s: _epoch(v) for s, v in zip(session_ids, values, strict=True)}


def note_traffic(worker_id: int, session_id: str = "") -> None:
    """A person used the worker (a terminal, a proxied request or message): busy now. Cheap
    enough for every chunk: Redis is written at most every NOTE_EVERY seconds per key and
    process, off the event loop when called on one."""
    key = f"{ACTIVITY_PREFIX}{worker_id}" + (f":s:{session_id}" if session_id else "")
    moment = time.monotonic()
    every = min(NOTE_EVERY, grace() / 4)
    if moment - _noted.get(key, -every) < every:
        return
    if len(_noted) > 100_000:
        _noted.clear()
    _noted[key] = moment
    try:
        asyncio.get_running_loop().run_in_executor(None, _write_traffic, worker_id, key)
    except RuntimeError:
        _write_traffic(worker_id, key)


def _write_traffic(worker_id: int, key: str) -> None:
    now = repr(time.time())
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.set(key, now, ex=ACTIVITY_TTL)
        pipe.set(f"{ACTIVITY_PREFIX}{worker_id}", now, ex=ACTIVITY_TTL)
        pipe.execute()
    except RedisError as exc:
        log.warning("traffic of worker %s not noted, Redis did not answer: %s", worker_id, exc)


# -- the policy ------------------------------------------------------------------------------


def policy_seconds(minutes: float | None) -> float | None:
    return None if not minutes else minutes * 60.0


def warning_lead(policy: float) -> float:
    """Seconds between the warning and the deletion."""
    return min(settings.ACTIVATE_IDLE_WARNING, policy / 2)


def describe_minutes(minutes: float) -> str:
    return f"{minutes:g} minute" + ("" if minutes == 1 else "s")


def idle_reason(minutes: float, *, what: str = "Deleted") -> str:
    return f"{what} after {describe_minutes(minutes)} idle"


def site_default(environment: Environment) -> float | None:
    """The site's idle policy for workers of an environment (else of its cluster)."""
    if environment.idle_minutes is not None:
        return environment.idle_minutes or None
    return environment.cluster.idle_minutes or None


class Decision:
    WAIT = "wait"
    WARN = "warn"
    END = "end"
    CLEAR = "clear"


def decide(idle_for: float, policy: float | None, warned_at: datetime | None, now: datetime) -> str:
    """What the idle policy does now with something idle ``idle_for`` seconds."""
    if policy is None:
        return Decision.WAIT
    lead = warning_lead(policy)
    if idle_for < policy - lead:
        return Decision.CLEAR if warned_at is not None else Decision.WAIT
    if warned_at is None:
        return Decision.WARN
    # The owner always gets the whole lead to press Keep, even after the platform was away.
    if idle_for >= policy and (now - warned_at).total_seconds() >= lead:
        return Decision.END
    return Decision.WAIT


def policy_problem(minutes: float | None) -> str | None:
    """Why an idle policy of ``minutes`` is refused (None or 0: no policy)."""
    if minutes is None or minutes == 0:
        return None
    if not math.isfinite(minutes) or minutes < 0:
        return "a number of minutes, or empty for never"
    shortest = settings.ACTIVATE_IDLE_SHORTEST / 60
    if minutes < shortest:
        return f"at least {shortest:g} minutes, or empty for never"
    return None


# -- warnings, Keep, and the sweep's step ------------------------------------------------------


def _idle_parts(subject: IdlePolicy) -> tuple[Worker, IdlePolicy | None]:
    """The worker a policy's subject is on, and the session when the subject is one."""
    if isinstance(subject, Worker):
        return subject, None
    return subject.worker, subject  # type: ignore[attr-defined]


def warn_idle(subject: IdlePolicy, now: datetime, *, live: str) -> bool:
    """Tell the owner that their idle worker (or session) ends a warning's lead from now; once,
    and only while it is ``live`` (its status)."""
    worker, session = _idle_parts(subject)
    with transaction.atomic():
        # Any model with a policy and a status: the keywords are checked when it runs.
        unwarned = {"pk": subject.pk, "status": live, "idle_warned_at__isnull": True}
        warned = type(subject)._default_manager.filter(**unwarned).update(idle_warned_at=now)
        if warned:
            subject.idle_warned_at = now
            lead = warning_lead(policy_seconds(subject.idle_minutes) or 0)
            signals.idle_warning.send(
                sender=type(subject),
                worker=worker,
                session=session,
                ends_at=now + timedelta(seconds=lead),
            )
    return bool(warned)


def reset_idle(subject: IdlePolicy, *, kept_at: datetime | None = None) -> bool:
    """Take a warning back (busy again); with ``kept_at`` (Keep), the clock starts there."""
    worker, session = _idle_parts(subject)
    changes: dict[str, datetime | None] = {"idle_warned_at": None}
    if kept_at is not None:
        changes["idle_kept_at"] = kept_at
    with transaction.atomic():
        changed = type(subject)._default_manager.filter(pk=subject.pk).update(**changes)
        signals.idle_warning_cleared.send(sender=type(subject), worker=worker, session=session)
    for field, value in changes.items():
        setattr(subject, field, value)
    return bool(changed)


def keep_worker(worker: Worker, *, owner: User) -> None:
    """Keep: the idle clock starts again now, and any warning is taken back."""
    if worker.owner_id != owner.pk:
        raise NotOwner("only the worker's owner can keep it")
    reset_idle(worker, kept_at=timezone.now())


def end_idle_worker(worker: Worker) -> bool:
    assert worker.idle_minutes is not None
    return delete_worker(worker, reason=idle_reason(worker.idle_minutes))


def apply_policy(worker: Worker, state: Idleness, now: datetime) -> str | None:
    """The idle sweep's step for one connected worker: warn its owner nearly a policy in, delete
    it past the policy (warned a whole lead before), or take the warning back when it is busy
    again. Returns what it did (a Decision), or None."""
    if not state.measured:
        return None
    decision = decide(
        state.idle_for(now), policy_seconds(worker.idle_minutes), worker.idle_warned_at, now
    )
    if decision == Decision.WARN:
        done = warn_idle(worker, now, live=WorkerStatus.CONNECTED)
    elif decision == Decision.CLEAR:
        done = reset_idle(worker)
    elif decision == Decision.END:
        done = end_idle_worker(worker)
    else:
        return None
    return decision if done else None

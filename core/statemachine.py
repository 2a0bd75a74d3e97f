"""The status machine that workers and sessions share.

A status changes only along its model's table of transitions, as a compare-and-set on the status
that was read plus an event row, in one transaction: two callers racing for the same change
cannot both win, because the loser's update matches no row. Side effects are queued by task
name once that transaction commits, so the machine knows nothing of the tasks themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from celery import current_app
from django.db import models, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from core.bulk import insert_all, update_each

log = logging.getLogger(__name__)

# Status -> the statuses it may move to; keyed by a status enum, whose members are strings.
Transitions = Mapping[Any, frozenset[str]]
M = TypeVar("M", bound=models.Model)

REASON_MAX = 512
_MAX_RACE_RETRIES = 5


def can_transition(table: Transitions, old: str, new: str) -> bool:
    return new in table.get(old, frozenset())


@dataclass(frozen=True)
class StateMachine(Generic[M]):
    """The statuses of ``model`` (columns ``status``, ``status_reason``, ``updated_at`` and
    ``finished_field``) and its history in ``event_model`` (a foreign key to ``model`` named
    after it, ``old_status``, ``new_status``, ``reason``, ``at``)."""

    model: type[M]
    event_model: type[models.Model]
    transitions: Transitions
    finished: frozenset[str]
    finished_field: str

    def change(
        self,
        obj: M,
        new: str,
        *,
        allowed_from: Iterable[str],
        reason: str,
        now: datetime | None = None,
        fields: Mapping[str, Any] | None = None,
        match: Mapping[str, Any] | None = None,
        after: Callable[[M, str], None] | None = None,
    ) -> bool:
        """Move ``obj`` to ``new`` if its stored status is one of ``allowed_from`` (and the rows
        also match ``match``), writing ``fields`` with it; ``after(obj, old)`` runs in the same
        transaction. Returns whether this call made the change; ``obj`` gets the written values.
        """
        allowed = frozenset(allowed_from)
        now = now or timezone.now()
        owner = self.model._meta.model_name
        rows = self.model._default_manager.filter(pk=obj.pk)
        values = self._written(new, reason, now, fields)
        for _ in range(_MAX_RACE_RETRIES):
            current = rows.values_list("status", flat=True).first()
            if current not in allowed or not can_transition(self.transitions, current, new):
                if current is not None:
                    setattr(obj, "status", current)  # noqa: B010 (M is any model with a status)
                return False
            with transaction.atomic():
                if rows.filter(status=current, **(match or {})).update(**values) == 1:
                    self.event_model._default_manager.create(
                        **{f"{owner}_id": obj.pk},
                        old_status=current,
                        new_status=new,
                        reason=values["status_reason"],
                        at=now,
                    )
                    for name, value in values.items():
                        setattr(obj, name, value)
                    if after is not None:
                        after(obj, current)
                    label = getattr(obj, "public_id", obj.pk)
                    log.info("%s %s: %s -> %s (%s)", owner, label, current, new, reason)
                    return True
                if match and not rows.filter(**match).exists():
                    return False
            # Someone else changed the status between our read and our write: read again.
        return False

    def _written(
        self, new: str, reason: str, now: datetime, fields: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The columns a change to ``new`` writes."""
        values: dict[str, Any] = {
            "status": new,
            "status_reason": reason[:REASON_MAX],
            "updated_at": now,
        }
        if new in self.finished:
            values[self.finished_field] = now
        values.update(fields or {})
        return values

    def change_many(
        self,
        objs: list[M],
        new: str,
        *,
        old: str,
        reason: str,
        now: datetime | None = None,
        fields: Mapping[str, Any] | None = None,
        each: Mapping[Any, Mapping[str, Any]] | None = None,
        after: Callable[[M, str], None] | None = None,
    ) -> list[M]:
        """``change`` for many objects at ``old``, each with ``fields`` and its own ``each[pk]``
        (the same names for all). Returns those it changed, in order.

        On PostgreSQL one update (a compare-and-set on every row: the status must still be
        ``old``) and one insert of events, instead of a read, an update and an insert each.
        ``after(obj, old)`` runs for each changed object in the same transaction.
        """
        now = now or timezone.now()
        each = each or {}
        if not can_transition(self.transitions, old, new):
            return []
        values = self._written(new, reason, now, fields)
        meta = self.model._meta
        owner = meta.model_name
        with transaction.atomic():
            own = {obj.pk: each.get(obj.pk, {}) for obj in objs}
            changed_pks = update_each(self.model, own, common=values, status=old)
            changed = [obj for obj in objs if obj.pk in changed_pks]
            insert_all(
                [
                    self.event_model(
                        **{f"{owner}_id": obj.pk},
                        old_status=old,
                        new_status=new,
                        reason=values["status_reason"],
                        at=now,
                    )
                    for obj in changed
                ]
            )
            for obj in changed:
                for name, value in {**values, **each.get(obj.pk, {})}.items():
                    setattr(obj, name, value)
                if after is not None:
                    after(obj, old)
                label = getattr(obj, "public_id", obj.pk)
                log.info("%s %s: %s -> %s (%s)", owner, label, old, new, reason)
        left = {obj.pk: obj for obj in objs if obj.pk not in changed_pks}
        if left:
            for pk, current in self.model._default_manager.filter(pk__in=left).values_list(
                "pk", "status"
            ):
                setattr(left[pk], "status", current)  # noqa: B010 (as in change)
        return changed


def _enqueue(task: str, args: tuple[object, ...]) -> None:
    try:
        # The composition root's app (activate/celery.py) is the current one in every process.
        current_app.signature(task, args=args).apply_async()
    except (OperationalError, RedisError, OSError) as exc:
        # The change is committed; answering an error now would make a client retry it. The
        # sweeps find what was not queued (pending workers, cancels, sessions to start).
        log.warning("could not queue %s%r (the sweeps will): %s", task, args, exc)


def enqueue_on_commit(task: str, *args: object) -> None:
    """Queue the Celery task named ``task`` once the current transaction commits.

    By name, so eager mode (ACTIVATE_TASKS_EAGER) still runs it in-process and no module that
    changes state imports the tasks.
    """
    transaction.on_commit(lambda: _enqueue(task, args))

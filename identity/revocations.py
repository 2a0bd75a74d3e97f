"""Users disabled on the platform (``is_active`` off), as every process sees within a moment.

When a user is saved or deleted, the set of disabled users in Redis follows once the change
commits. Processes holding SSH connections or terminals as a user (web, Celery, proxies) look
their owners up there every few seconds and close what a disabled user holds; signing a
certificate looks too. (A bulk ``update()`` sends no signal: disable users one by one, as the
admin does.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import redis
from django.db import transaction

from core.redis_connection import redis_client

log = logging.getLogger(__name__)

DISABLED_USERS = "activate:disabled-users"
# How often a process holding connections or terminals as users looks for disabled ones: a
# disabled user's last connection closes within this and the time a close takes.
CHECK_EVERY = 10.0


def user_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    user_id, active = instance.pk, bool(instance.is_active)
    transaction.on_commit(lambda: _note(user_id, disabled=not active))


def user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    user_id = instance.pk
    transaction.on_commit(lambda: _note(user_id, disabled=True))


def _note(user_id: int, *, disabled: bool) -> None:
    try:
        if disabled:
            redis_client().sadd(DISABLED_USERS, user_id)
        else:
            redis_client().srem(DISABLED_USERS, user_id)
    except redis.RedisError as exc:
        log.error(
            "cannot note user %s as %s: %s", user_id, "disabled" if disabled else "active", exc
        )


def disabled_among(user_ids: Iterable[int]) -> set[int]:
    """Those of ``user_ids`` disabled (or deleted); RedisError when Redis cannot say."""
    ids = sorted(set(user_ids))
    if not ids:
        return set()
    flags = redis_client().smismember(DISABLED_USERS, ids)
    return {user_id for user_id, flag in zip(ids, flags, strict=True) if flag}


def is_disabled(user_id: int) -> bool:
    return bool(disabled_among([user_id]))

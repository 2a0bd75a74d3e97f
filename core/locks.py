"""Per-worker mutual exclusion for submission, released even if the holder is SIGKILLed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.conf import settings
from django.db import connection

from core.redis_connection import redis_client

LOCK_NAMESPACE = 0x41435456  # "ACTV": keeps our advisory locks apart from other users'.


@contextmanager
def submission_lock(worker_id: int) -> Iterator[bool]:
    """Yield whether the lock was taken; never blocks.

    On PostgreSQL a session advisory lock dies with the connection, so a killed Celery
    process frees it at once. Elsewhere (SQLite in development) a Redis lock with a TTL.
    """
    if connection.vendor == "postgresql":
        key = worker_id % 2**31
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_NAMESPACE, key])
            taken = bool(cursor.fetchone()[0])
        try:
            yield taken
        finally:
            if taken:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_NAMESPACE, key])
        return
    lock = redis_client().lock(
        f"activate:submit-lock:{worker_id}", timeout=settings.CELERY_TASK_TIME_LIMIT
    )
    taken = bool(lock.acquire(blocking=False))
    try:
        yield taken
    finally:
        if taken:
            lock.release()


@contextmanager
def submission_locks(worker_ids: list[int]) -> Iterator[set[int]]:
    """``submission_lock`` for many workers at once: yields the ids whose lock was taken.

    On PostgreSQL one query takes them all and one releases them.
    """
    if connection.vendor != "postgresql":
        with ExitStack() as stack:
            taken = {w for w in worker_ids if stack.enter_context(submission_lock(w))}
            yield taken
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM unnest(%s::bigint[]) AS id"
            " WHERE pg_try_advisory_lock(%s, (id %% %s)::int)",
            [worker_ids, LOCK_NAMESPACE, 2**31],
        )
        taken = {int(row[0]) for row in cursor.fetchall()}
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s, (id %% %s)::int)"
                    " FROM unnest(%s::bigint[]) AS id",
                    [LOCK_NAMESPACE, 2**31, sorted(taken)],
                )


def submissions_under_way() -> set[int]:
    """Workers whose submission lock someone holds now (a submission under way, or a holder
    cut off whose lock stands until its silence runs out).

    On PostgreSQL the locks' keys are the ids modulo 2**31, so an id above that may stand for
    another; harmless where this only defers work by a sweep.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = %s AND objsubid = 2",
                [LOCK_NAMESPACE],
            )
            return {int(row[0]) for row in cursor.fetchall()}
    prefix = "activate:submit-lock:"
    return {
        int(key.decode().removeprefix(prefix))
        for key in redis_client().scan_iter(f"{prefix}*", count=1000)
    }

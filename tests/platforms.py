"""A whole platform shared by a module's tests: started once (about fifteen CPU-seconds on two
cores), each test bringing its own rows (the database is emptied after every test) and Redis keys.

While one runs, a test's Redis clean-up leaves Celery's own keys (kombu's queue bindings and
unacknowledged tasks): flushing them under a live worker would route every later task nowhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from harness.platform import Platform

RUNNING: list[Platform] = []
CELERYS_OWN = (b"_kombu.", b"unacked")


@contextmanager
def sharing(platform: Platform) -> Iterator[Platform]:
    """``platform`` running, for tests after tests: Redis clean-ups spare Celery's keys."""
    with platform.running() as running:
        RUNNING.append(running)
        try:
            yield running
        finally:
            RUNNING.remove(running)


def module_platform(**options: Any) -> Callable[..., Iterator[Platform]]:
    """A module-scoped fixture running ``Platform(**options)``; the test asks for it beside
    ``transactional_db`` (the platform's processes see only committed rows)."""

    @pytest.fixture(scope="module")
    def shared(
        django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Platform]:
        with sharing(Platform(workdir=tmp_path_factory.mktemp("platform"), **options)) as running:
            yield running

    return shared


def clean_redis(client: Any) -> None:
    """Empty the test's Redis database, but for Celery's keys while a shared platform runs."""
    if not RUNNING:
        client.flushdb()
        return
    doomed = [
        key
        for key in client.scan_iter(count=1000)
        if not (key if isinstance(key, bytes) else key.encode()).startswith(CELERYS_OWN)
    ]
    if doomed:
        client.delete(*doomed)

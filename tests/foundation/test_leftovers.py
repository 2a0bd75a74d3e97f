"""The leftover finder (tests/leftovers.py) that fails a test file whose platform processes
outlive it, or a test that leaves another Celery app current: it finds a process by the
database its environment names, and only that one, and names the app."""

from __future__ import annotations

import os
import subprocess
import sys

from celery import Celery, current_app

from activate.celery import app as platform_app
from tests.leftovers import celery_app_left, leftovers, platform_processes


def started_with(database_url: str) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=environ)


def test_a_process_naming_the_database_is_found_until_it_ends() -> None:
    mine = started_with("postgres://postgres@127.0.0.1:5432/test_probe_left?sslmode=disable")
    other = started_with("postgres://postgres@127.0.0.1:5432/test_probe_left_other")
    try:
        found = platform_processes("test_probe_left")
        assert list(found) == [mine.pid] and "time.sleep(60)" in found[mine.pid]
        mine.kill()
        mine.wait()
        assert leftovers("test_probe_left", grace=2) == {}
        assert list(platform_processes("test_probe_left_other")) == [other.pid]
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()


def test_a_celery_app_made_current_by_a_test_is_named_and_the_platforms_made_current_again() -> (
    None
):
    assert celery_app_left() is None
    Celery("stray", broker="redis://127.0.0.1:1/0")  # current, as Celery makes every new app
    assert current_app.main == "stray"
    problem = celery_app_left()
    assert problem is not None and "'stray'" in problem
    assert current_app._get_current_object() is platform_app
    assert celery_app_left() is None

"""What a test leaves behind for the tests after it fails it, since those fail far away from it
(in another file, only in the full run):

- Celery's current app not the platform's: Celery makes each new ``Celery(...)`` the current
  app, and the platform sends through ``current_app`` (core/statemachine.py), so a test that built
  one for itself sent every later test's tasks to that app's queue. Checked after each test; the
  platform's app is made current again.
- Platform processes still running: a Celery worker still consuming this xdist process's Redis
  number takes the next files' queued tasks out from under them, and one still holding a
  connection keeps the test database from being dropped. Found by the environment every platform
  process is given (harness/platform.py): its DATABASE_URL names this process's test database.
  Checked when the last test of a file has torn down (module-scoped platforms live through their
  file), after a grace for groups still exiting; what is found is killed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Generator
from contextlib import suppress
from pathlib import Path

import pytest
from celery import current_app
from django.conf import settings

from activate.celery import app as platform_app

# Seconds a stopped group's members may take to exit after their leader was reaped.
GRACE = 10.0


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(entry.partition(b"=")[::2] for entry in raw.split(b"\0") if entry)


def _names_database(url: bytes, name: bytes) -> bool:
    path = url.partition(b"?")[0]
    return path.rpartition(b"/")[2] == name


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def test_database() -> str:
    """This process's test database, whether pytest-django has switched to it or not yet (or no
    longer)."""
    db = settings.DATABASES["default"]
    name = str(db["NAME"])
    return str(
        (db.get("TEST") or {}).get("NAME") or (name if name.startswith("test_") else f"test_{name}")
    )


def platform_processes(database: str) -> dict[int, str]:
    """Live processes (not zombies, not this one or its parents) started with DATABASE_URL
    naming ``database``: pid to command line."""
    name = database.encode()
    found = {}
    mine = _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        pid = int(entry.name)
        url = _environ(pid).get(b"DATABASE_URL")
        if url is None or not _names_database(url, name):
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[pid] = argv.strip()
    return found


def leftovers(database: str, grace: float = GRACE) -> dict[int, str]:
    deadline = time.monotonic() + grace
    while (found := platform_processes(database)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def celery_app_left() -> str | None:
    """What is wrong if Celery's current app is not the platform's (made current again)."""
    current = current_app._get_current_object()
    if current is platform_app:
        return None
    platform_app.set_current()
    return (
        f"left Celery's current app {current.main!r}, not the platform's: every later task "
        "would have gone through it (build apps with set_as_current=False)"
    )


def _last_of_its_file(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    return nextitem is None or nextitem.path != item.path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    yield
    problems = [problem] if (problem := celery_app_left()) else []
    if _last_of_its_file(item, nextitem):
        database = test_database()
        found = leftovers(database)
        for pid in found:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if found:
            listed = "\n".join(f"  {pid}: {argv[:200]}" for pid, argv in sorted(found.items()))
            problems.append(
                f"{item.path.name} left {len(found)} platform process(es) of {database} "
                f"running (killed now):\n{listed}"
            )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)

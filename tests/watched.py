"""The neighbour watching every process while the tests that start them run (the e2e, sessions,
relay and agent tests): a test whose run put a secret of the platform's where another Unix user
could read it (a command line, or an environment that user may read) fails, naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from harness.cluster import SshTarget
from harness.watcher import Watcher, gather_platform_secrets

WATCHED = (
    "e2e",
    "sessions",
    "agents/signing",
    "workers/terminals",
    "agents/heartbeats",
    "workers/certificates",
    "files",
)
TESTS = Path(__file__).parent


def watched(item: pytest.Item) -> bool:
    path = Path(str(item.fspath))
    if not path.is_relative_to(TESTS):
        return False
    inside = path.relative_to(TESTS).parts
    return any(inside[: len(Path(folder).parts)] == Path(folder).parts for folder in WATCHED)


def _uses_database(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "transactional_db" in names or "db" in names or "live_server" in names


@pytest.fixture(scope="session")
def neighbour_watcher(
    ssh_target: SshTarget, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watcher]:
    """An ordinary second Unix user of the test cluster (never root) watching new processes."""
    neighbour = sorted(ssh_target.accounts)[-1]
    out = tmp_path_factory.mktemp("neighbour-watch") / "processes.jsonl"
    watcher = Watcher(neighbour, out).start()
    yield watcher
    watcher.stop()


class _Gathering:
    """The platform's secrets read from its database and Redis every second while a test runs
    (a session deleted before the test ends is still known)."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="secret-gathering", daemon=True)

    def _run(self) -> None:
        from django.db import connection

        while not self.done.wait(1.0):
            # Between tests the database is closed to threads (pytest-django): read next time.
            with suppress(Exception):
                gather_platform_secrets(self.watcher.book)
            connection.close()


@pytest.fixture(autouse=True)
def _neighbour_watch(request: pytest.FixtureRequest) -> Iterator[None]:
    if not watched(request.node):
        yield
        return
    watcher: Watcher = request.getfixturevalue("neighbour_watcher")
    gathering = _Gathering(watcher)
    request.node._neighbour_watch = (watcher, watcher.mark(), gathering)
    if "transactional_db" in request.fixturenames or "live_server" in request.fixturenames:
        gathering.thread.start()
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    try:
        result = yield
    finally:
        state = getattr(item, "_neighbour_watch", None)
        if state is not None:
            state[2].done.set()
            if state[2].thread.is_alive():
                state[2].thread.join(10)
    if state is None:
        return result
    watcher, start, _ = state
    if _uses_database(item):
        gather_platform_secrets(watcher.book)
    end = watcher.mark()
    leaks = watcher.leaks_between(start, end)
    if leaks:
        raise AssertionError(
            "a neighbour (another Unix user) read secrets of the platform's:\n"
            + "\n".join(f"  {leak}" for leak in leaks)
        )
    return result

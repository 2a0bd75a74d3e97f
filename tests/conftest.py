from __future__ import annotations

import os
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.core.management import call_command

from core.redis_connection import redis_client
from harness import HarnessError, cells
from harness import platform as harness_platform
from harness.cluster import SshTarget
from tests.leftovers import pytest_runtest_teardown  # noqa: F401
from tests.platforms import clean_redis
from tests.watched import _neighbour_watch, neighbour_watcher, pytest_runtest_call  # noqa: F401
from workers_app.models import Cluster


def pytest_configure(config: pytest.Config) -> None:
    # The suite starts some seventy platforms on two cores: slim ones unless a test asks for
    # scripts/start.sh's numbers (harness/platform.py).
    harness_platform.DEFAULT_SHAPE = harness_platform.SLIM


def pytest_sessionstart(session: pytest.Session) -> None:
    # Platforms serve the pages' scripts and styles through WhiteNoise from STATIC_ROOT, as a
    # deployment does: collected once, before any xdist process starts one (a page without
    # htmx never refreshes, and a test of it waits out its time).
    if not hasattr(session.config, "workerinput"):
        call_command("collectstatic", interactive=False, verbosity=0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of real processes first, then those of the real cluster, then the rest, each in
    the order they had (pytest-django's, whose sort runs before this one). xdist hands out
    files in this order (the Makefile's --dist loadfile --no-loadscope-reorder) to whichever
    process is free: the files of minute-long tests start early and the run ends on quick
    ones instead of waiting on a wall time begun last.

    Items that share a node id get their own: schemathesis gives each API operation's item the
    test's id, and xdist, which hands out files by id, ran one of 29."""
    shared = Counter(item.nodeid for item in items)
    for item in items:
        if shared[item.nodeid] > 1:
            own = f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}"
            # pytest 9 keeps the id structured (NodeId), earlier ones as the string.
            if hasattr(item, "_id"):
                item._id = type(item._id).parse(own)
            else:
                item._nodeid = own
    items.sort(
        key=lambda item: (
            0 if item.get_closest_marker("live") else 1 if item.get_closest_marker("slurm") else 2
        )
    )


@pytest.fixture(scope="session")
def ssh_target() -> SshTarget:
    """The real Slurm cluster over real SSH that scripts/testcluster.sh starts."""
    try:
        return SshTarget.running()
    except HarnessError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def cluster_accounts(ssh_target: SshTarget) -> list[tuple[str, str]]:
    """The test cluster's per-user accounts: (remote username, private key text), two at least."""
    if len(ssh_target.accounts) < 2:
        pytest.fail("the test cluster has no per-user accounts: run `scripts/testcluster.sh up`")
    return [(name, Path(key).read_text()) for name, key in sorted(ssh_target.accounts.items())]


@pytest.fixture
def cell_kind() -> str:
    """The scheduler a test runs on: Slurm, unless it is parametrized over cells.KINDS."""
    return "slurm"


@pytest.fixture
def cell(cell_kind: str, ssh_target: SshTarget) -> cells.Cell:
    return cells.cell(cell_kind, ssh_target)


@pytest.fixture
def make_cluster(db: None, ssh_target: SshTarget):
    """A cluster on the test Slurm. Shared (everyone acts as its pwtest account) unless the
    test asks for shared=False: the per-user isolation tests do."""

    def make(name: str = "test-slurm", scheduler: str = "slurm", **overrides: object) -> Cluster:
        cluster = Cluster(
            shared=True,
            name=name,
            host=ssh_target.host,
            port=ssh_target.port,
            username=ssh_target.user,
            host_key=ssh_target.host_key,
            scheduler=scheduler,
        )
        cluster.set_private_key(ssh_target.private_key)
        for key, value in overrides.items():
            setattr(cluster, key, value)
        cluster.save()
        return cluster

    return make


@pytest.fixture
def user(db: None) -> AbstractUser:
    return get_user_model().objects.create_user("alice", password="pw-alice-123")  # type: ignore[return-value]


@pytest.fixture
def other_user(db: None) -> AbstractUser:
    return get_user_model().objects.create_user("bob", password="pw-bob-123")  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Each test starts with an empty Redis database of its own (REDIS_URL picks the number)."""
    clean_redis(redis_client())
    yield


# Seconds the interpreter may take to exit once the session is over.
EXIT_GRACE = 60


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A thread left blocked by some test (an executor's worker waiting on a dead channel, say)
    must not keep a finished run from exiting: CI would wait out its whole time. After
    EXIT_GRACE seconds the threads still there are printed, to be fixed, and the process exits
    red: with the session's own status, or TESTS_FAILED if that was OK (a run that had to be
    forced out is not a green run)."""
    if hasattr(session.config, "workerinput"):
        # An xdist worker waits, after its session, for the controller to end the whole run;
        # the controller's own watchdog covers that end (it terminates a worker that hangs).
        return
    forced_status = int(exitstatus) or int(pytest.ExitCode.TESTS_FAILED)

    def watchdog() -> None:
        threading.Event().wait(EXIT_GRACE)
        frames = sys._current_frames()
        lines = [f"pytest: still running {EXIT_GRACE} s after the session ended:"]
        for thread in threading.enumerate():
            if thread is threading.current_thread() or thread.ident not in frames:
                continue
            kind = "daemon" if thread.daemon else "NON-DAEMON"
            lines.append(f"-- thread {thread.name} ({kind})")
            lines += traceback.format_stack(frames[thread.ident])
        lines.append(
            f"pytest: exit forced, with status {forced_status} (the session's: {exitstatus})"
        )
        print("\n".join(lines), file=sys.__stderr__ or sys.stderr, flush=True)
        os._exit(forced_status)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()

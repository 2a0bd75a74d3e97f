from __future__ import annotations

import os

from core.env import TEST_SECRET_KEY

# A fixed key, so that the test run and the processes it starts read each other's encrypted
# keys; the other settings refuse it.
os.environ.setdefault("ACTIVATE_SECRET_KEY", TEST_SECRET_KEY)
# Test runs, benchmarks and drills share one Slurm account on a machine: each names its own jobs.
os.environ.setdefault("ACTIVATE_INSTALLATION_ID", "test")


def _apart_per_xdist_worker() -> None:
    """Each pytest-xdist worker (gw0, gw1, ...) is an installation of its own with a Redis number
    of its own, counting down from the run's: its sweeps and reconcile leave the others' workers
    and jobs alone (pytest-django gives it a database of its own). Applied once per worker; the
    processes it starts are told the values themselves."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker or os.environ.get("PYTEST_XDIST_WORKER_APART") == worker:
        return
    number = int(worker.removeprefix("gw"))
    # A sentinel:// URL's query (the sentinels' password) follows its number.
    url, mark, query = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15").partition("?")
    base, _, db = url.rpartition("/")
    if not db.isdigit() or int(db) < number:
        raise ValueError(f"REDIS_URL must end in a Redis number of {number} or more for {worker}")
    os.environ["REDIS_URL"] = f"{base}/{int(db) - number}{mark}{query}"
    installation = os.environ["ACTIVATE_INSTALLATION_ID"]
    os.environ["ACTIVATE_INSTALLATION_ID"] = f"{installation[:12]}w{number}"
    os.environ["PYTEST_XDIST_WORKER_APART"] = worker


_apart_per_xdist_worker()
# Unit tests run no web server for the sweep to ask; live tests set it back on for their processes.
os.environ.setdefault("ACTIVATE_HEARING_PROBE", "false")

from .base import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

from __future__ import annotations

import os

from activate.env import TEST_SECRET_KEY

# A fixed key, so that the test run and the processes it starts read each other's encrypted
# keys; the other settings refuse it.
os.environ.setdefault("ACTIVATE_SECRET_KEY", TEST_SECRET_KEY)
# Test runs, benchmarks and drills share one Slurm account on a machine: each names its own jobs.
os.environ.setdefault("ACTIVATE_INSTALLATION_ID", "test")
# Unit tests run no web server for the sweep to ask; live tests set it back on for their processes.
os.environ.setdefault("ACTIVATE_HEARING_PROBE", "false")

from .base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

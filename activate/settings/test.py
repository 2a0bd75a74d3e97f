from __future__ import annotations

import os

# Test runs, benchmarks and drills share one Slurm account on a machine: each names its own jobs.
os.environ.setdefault("ACTIVATE_INSTALLATION_ID", "test")
# Unit tests run no web server for the sweep to ask; live tests set it back on for their processes.
os.environ.setdefault("ACTIVATE_HEARING_PROBE", "false")

from .base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

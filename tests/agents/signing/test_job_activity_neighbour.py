"""A neighbour on the node cannot make someone's job look busy: the agent (run here as pwalice,
an ordinary Unix user) never counts pwbob's processes, even ones that name her job, and the OS
refuses her reading their I/O and environment anyway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from node import activate_agent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs as two other Unix users")

LOOP = "while True: pass  # activity-neighbour-loop"
PROBE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import activate_agent as a
watch = a.JobActivity(a.os.getuid(), "job-77", "SLURM_JOB_ID")
watch.sample()
time.sleep(1.5)
report = watch.sample()
print(json.dumps({"cpu": report.cpu, "pids": sorted(watch.processes())}))
"""


def test_a_neighbours_busy_process_naming_the_job_never_counts() -> None:
    if shutil.which("runuser") is None or subprocess.run(["id", "pwbob"]).returncode != 0:
        pytest.fail("the test cluster's users (pwalice, pwbob) are missing: make cluster")
    # Where pwalice can read the agent (pytest's own folders are root's alone).
    tmp_path = Path(tempfile.mkdtemp(prefix="activity-neighbour-"))
    tmp_path.chmod(0o755)
    shutil.copy(activate_agent.__file__, tmp_path / "activate_agent.py")
    (tmp_path / "activate_agent.py").chmod(0o644)
    env = "env ACTIVATE_JOB_ID=job-77 SLURM_JOB_ID=job-77"
    busy = subprocess.Popen(["runuser", "-u", "pwbob", "--", *env.split(), "python3", "-c", LOOP])
    try:
        time.sleep(0.3)
        # The OS refuses pwalice bob's process's I/O counters and environment.
        for name in ("io", "environ"):
            refused = subprocess.run(
                ["runuser", "-u", "pwalice", "--", "cat", f"/proc/{busy.pid}/{name}"],
                capture_output=True,
            )
            assert refused.returncode != 0, name
        probe = subprocess.run(
            ["runuser", "-u", "pwalice", "--", "python3", "-c", PROBE, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout)
        assert busy.pid not in seen["pids"] and seen["cpu"] < 0.2, seen
    finally:
        # runuser does not pass a kill on: end bob's loop itself.
        subprocess.run(["pkill", "-u", "pwbob", "-f", "activity-neighbour-loop"], check=False)
        busy.wait()
        shutil.rmtree(tmp_path)

"""A user who connected nothing requests a worker on a cluster that trusts the platform's CA:
the live platform submits it as their mapped Unix name, by certificate, and `pw ssh` there says
so; disabled in the admin, their open terminal closes within the bound. Live platform, real
Slurm over real SSH."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from identity import revocations
from tests.e2e.conftest import PW, pw_runner
from tests.e2e.test_accounts import connected
from tests.platforms import module_platform
from workers_app.models import (
    AccountOrigin,
    ApiKey,
    Cluster,
    Environment,
    EnvironmentField,
    TerminalRecord,
    Worker,
)

pytestmark = [pytest.mark.slurm, pytest.mark.live]

shared_platform = module_platform()


@pytest.fixture
def platform(transactional_db: None, shared_platform: Platform) -> Platform:
    return shared_platform


def job_owner(job_id: str) -> str:
    shown = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%u"], capture_output=True, text=True, timeout=30
    )
    return shown.stdout.strip()


def test_a_worker_of_a_user_with_no_account_runs_as_their_mapped_name_and_closes_when_disabled(
    platform: Platform, ca_cluster: Cluster, user: User, ssh_target: SshTarget, tmp_path: Path
) -> None:
    environment = Environment.objects.create(
        cluster=ca_cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    pw = pw_runner(platform, user, tmp_path / "alice")
    # Given alice never connected an account on this cluster
    created = pw("workers", "create", ca_cluster.name, "--environment", "compute")
    assert created.returncode == 0, created.stderr + platform.logs()
    worker = connected(Worker.objects.get(owner=user), platform)
    try:
        # Then her worker runs as the name the cluster's rule gives her, by certificate
        assert worker.account is not None
        assert (worker.account.remote_username, worker.account.origin) == (
            "pwalice",
            AccountOrigin.CERTIFICATE,
        )
        assert job_owner(worker.scheduler_job_id) == "pwalice"
        whoami = pw("ssh", worker.public_id, "id", "-un")
        assert (whoami.returncode, whoami.stdout.strip()) == (0, "pwalice"), whoami.stderr

        # When an operator disables her while a terminal of hers is open
        _, key = ApiKey.issue(user)
        env = {**os.environ, "HOME": str(tmp_path / "alice"), "PW_API_KEY": key}
        env["PW_PLATFORM_HOST"] = platform.url
        terminal = subprocess.Popen(
            [str(PW), "ssh", worker.public_id, "sleep", "600"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(
            lambda: TerminalRecord.objects.filter(worker=worker, closed_at=None).exists(),
            timeout=60,
        )
        user.is_active = False
        user.save()
        disabled_at = time.monotonic()
        # Then the terminal closes within the bound, saying why
        _, stderr = terminal.communicate(timeout=revocations.CHECK_EVERY + 30)
        closed_after = time.monotonic() - disabled_at
        assert terminal.returncode != 0 and "disabled" in stderr, stderr
        assert closed_after <= revocations.CHECK_EVERY + 5, closed_after
        print(f"the terminal closed {closed_after:.1f} s after the user was disabled")
    finally:
        worker.refresh_from_db()
        if worker.scheduler_job_id:
            subprocess.run(["scancel", worker.scheduler_job_id], timeout=60, check=False)

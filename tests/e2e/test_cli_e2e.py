"""The real `pw` against a live platform (web, Celery, beat) and each real scheduler over SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import Platform
from tests.e2e.conftest import on_every_scheduler, pw_runner
from workers_app.models import Environment, EnvironmentField, Worker, job_name_for

pytestmark = [pytest.mark.slurm, pytest.mark.live]


@on_every_scheduler
def test_create_wait_list_ssh_and_delete_a_worker_with_pw(
    platform: Platform,
    environment: Environment,
    cell: Cell,
    user: User,
    tmp_path: Path,
    ssh_target: SshTarget,
) -> None:
    pw = pw_runner(platform, user, tmp_path)
    cluster = environment.cluster.name
    created = pw(
        "workers",
        "create",
        cluster,
        "--environment",
        environment.name,
        "--param",
        "walltime=00:05:00",
        "--wait",
        "-o",
        "json",
    )
    assert created.returncode == 0, created.stderr + platform.logs()
    worker = json.loads(created.stdout)
    assert worker["status"] == "connected" and worker["node_hostname"]
    # Progress lines follow the lifecycle; a stage passed between two polls may not be shown.
    shown = [line.split(": ", 1)[1].split()[0] for line in created.stderr.splitlines()]
    order = ["pending", "queued", "starting", "connected"]
    assert shown[-1] == "connected"
    assert shown == sorted(shown, key=order.index)

    listed = pw("workers", "ls", "--cluster", cluster)
    assert listed.returncode == 0 and worker["id"] in listed.stdout.splitlines()[1]

    remote = pw("ssh", worker["id"], "sh", "-c", f"echo ${cell.job_id_variable}; exit 7")
    assert remote.returncode == 7
    assert remote.stdout.strip() == worker["scheduler_job_id"]

    deleted = pw("workers", "delete", worker["id"], "--wait", "-o", "json")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["status"] == "stopped"
    assert job_name_for(worker["id"]) not in cell.job_names(ssh_target.user)


def test_a_missing_required_field_fails_naming_it_and_submits_nothing(
    platform: Platform, slurm_environment: Environment, user: User, tmp_path: Path
) -> None:
    EnvironmentField.objects.create(
        environment=slurm_environment,
        name="account",
        directive="--account={value}",
        required=True,
    )
    pw = pw_runner(platform, user, tmp_path)
    result = pw(
        "workers",
        "create",
        slurm_environment.cluster.name,
        "--environment",
        slurm_environment.name,
        "--wait",
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["pw: error: account: is required"]
    assert not Worker.objects.exists()

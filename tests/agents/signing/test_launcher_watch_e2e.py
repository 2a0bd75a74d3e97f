"""The worker's agent watches its sessions' launchers: one killed on the node ends its session
within seconds, with no request to the session. On the real Slurm over real SSH, as the
owner's account."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from harness import REPO
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from sessions_app.models import Session
from sessions_app.services import REASON_PROGRAM_ENDED
from tests.e2e.conftest import pw_runner
from tests.processes import descendants
from workers_app.models import Environment, EnvironmentField, Worker
from workers_app.statuses import LIVE

pytestmark = [pytest.mark.slurm, pytest.mark.live]


@pytest.fixture(scope="module", autouse=True)
def session_tools() -> None:
    """What sessions run on the node (this machine): scripts/session-tools.sh, cached."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "session-tools.sh")], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/session-tools.sh failed:\n{result.stderr[-3000:]}")


@pytest.fixture
def alice(transactional_db: None) -> User:
    return get_user_model().objects.create_user("alice", password="pw-watch-123")


@pytest.fixture
def pw(
    transactional_db: None,
    tmp_path: Path,
    alice: User,
    make_cluster: Any,
    ssh_target: SshTarget,
) -> Iterator[Any]:
    cluster = make_cluster(name="sessions", shared=False)
    compute = Environment.objects.create(
        cluster=cluster, name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=compute, name="walltime", directive="--time={value}", default="00:15:00"
    )
    with Platform(workdir=tmp_path).running() as platform:
        run = pw_runner(platform, alice, tmp_path / "alice")
        remote = sorted(ssh_target.accounts)[0]
        connected = run(
            "cluster", "connect", "sessions", "--user", remote, "--key-file",
            ssh_target.accounts[remote],
        )  # fmt: skip
        assert connected.returncode == 0, connected.stderr
        yield run
        for worker in Worker.objects.filter(owner=alice, status__in=LIVE):
            run("workers", "delete", worker.public_id, "--wait")


def launcher_argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_a_killed_launcher_ends_its_session_within_seconds_with_no_request_to_it(
    pw: Any, request: pytest.FixtureRequest
) -> None:
    # Given a desktop running on alice's connected worker
    made = pw("workers", "create", "sessions", "--environment", "compute", "--wait", "-o", "json")
    assert made.returncode == 0, made.stderr
    worker_id = json.loads(made.stdout)["id"]
    created = pw(
        "sessions", "create", "--type", "desktop", "sessions", "--worker", worker_id,
        "--wait", "-o", "json", timeout=300,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    session_id = json.loads(created.stdout)["id"]
    pid = Session.objects.get(public_id=session_id).node_pid
    assert pid is not None
    argv = launcher_argv(pid)
    assert argv[argv.index("--activate-session") + 1] == session_id
    owner = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    assert owner != "root"

    programs = descendants(pid)
    assert programs, "the desktop's programs were not found below its launcher"

    # When its owner kills the launcher outright (nothing of it can say goodbye)
    started = time.monotonic()
    subprocess.run(["runuser", "-u", owner, "--", "kill", "-9", str(pid)], check=True)
    # Its programs are orphans the test node's Slurm does not track (proctrack/linuxproc).
    request.addfinalizer(lambda: subprocess.run(["kill", "-9", *map(str, programs)], check=False))

    # Then the session ends for that reason within 10 s, and the worker stays connected
    def ended() -> bool:
        return Session.objects.get(public_id=session_id).status == "ended"

    wait_for(ended, timeout=10, interval=0.1)
    took = time.monotonic() - started
    print(f"session ended {took:.1f} s after its launcher was killed")
    after = Session.objects.get(public_id=session_id)
    assert after.status_reason == REASON_PROGRAM_ENDED
    assert Worker.objects.get(public_id=worker_id).status == "connected"

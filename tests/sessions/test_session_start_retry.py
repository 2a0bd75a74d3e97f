"""A session whose start fails on the login host's SSH server starts again a few seconds later
instead of failing, and leaves one program on the node. Real Slurm over real SSH: the SSH server
is stopped (its connections dropped) when the session is asked for, and started again once the
start has failed on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness import cluster
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import poll, wait_for
from sessions_app.services import RETRYING
from tests.sessions.test_jupyter_neighbour import processes_of
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    worker_of,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]


def launchers(owner: str, session_id: str) -> list[int]:
    """The session's launcher processes on the node (not the job steps' clients)."""
    return [
        pid
        for pid in processes_of(owner, f"--activate-session\0{session_id}")
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"python3")
    ]


def test_a_start_cut_off_by_a_dropped_ssh_connection_starts_again_with_one_program(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    # Given: alice's connected worker, and the login host's SSH server gone for a moment.
    worker_id = worker_of(pw)
    owner = sorted(ssh_target.accounts)[0]
    cluster.testcluster("stop-sshd")
    try:
        # When: she asks for a desktop on the worker meanwhile (the platform's web answers), and
        # the SSH server is back once the start has failed on it.
        asked = pw(
            "sessions",
            "create",
            "--type",
            "desktop",
            "sessions",
            "--worker",
            worker_id,
            "-o",
            "json",
        )
        assert asked.returncode == 0, asked.stderr
        session_id = json.loads(asked.stdout)["id"]
        wait_for(
            lambda: (
                session_state(session_id).events.filter(reason__startswith=RETRYING).exists()
                or session_state(session_id).status == "failed"
            ),
            timeout=60,
        )
    finally:
        cluster.testcluster("start-sshd")

    # Then: the session starts again on its own and runs; its history says why it started twice.
    wait_for(lambda: session_state(session_id).status in {"running", "failed"}, timeout=120)
    session = session_state(session_id)
    assert (session.status, session.status_reason) == ("running", "")
    reasons = [e.reason for e in session.events.all()]
    retried = [r for r in reasons if r.startswith(RETRYING)]
    # One retry, or two when the SSH server took longer than the 3 s between tries to come back.
    assert 1 <= len(retried) <= 2, reasons
    assert "cannot connect" in retried[0], retried[0]
    # One program on the node, the one the platform knows: whatever the cut start left ended.
    found = poll(lambda: launchers(owner, session_id) == [session.node_pid], timeout=30)
    assert found, (launchers(owner, session_id), session.node_pid, processes_of(owner, session_id))
    listed = json.loads(pw("sessions", "ls", "--worker", worker_id, "-o", "json").stdout)
    url = next(s["url"] for s in listed if s["id"] == session_id)
    _, key = ApiKey.issue(alice)
    answer = httpx.get(url + "vnc.html", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200

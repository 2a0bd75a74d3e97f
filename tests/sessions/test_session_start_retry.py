"""A session whose start is cut off by a dropped SSH connection starts again a few seconds later
instead of failing, and leaves one program on the node. Real Slurm over real SSH, through a
relay (tests/sessions/ssh_relay.py): the connection drops after the start command has run on the
login host and before the platform has read its answer, so the first start's program is
already on its way on the node when the platform tries again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import poll, wait_for
from sessions_app.services import RETRYING
from tests.e2e.conftest import compute_environment
from tests.sessions.ssh_relay import SshRelay
from tests.sessions.test_jupyter_neighbour import processes_of
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
    worker_of,
)
from workers_app.models import ApiKey, Environment

pytestmark = [pytest.mark.slurm, pytest.mark.live]

# How late sshd's answers reach the platform while the start is awaited: far longer than the
# test takes to see the start command's processes on the login host.
HELD = 3.0


def launchers(owner: str, session_id: str) -> list[int]:
    """The session's launcher processes on the node (not the job steps' clients)."""
    return [
        pid
        for pid in processes_of(owner, f"--activate-session\0{session_id}")
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"python3")
    ]


@pytest.fixture
def relay(ssh_target: SshTarget) -> Iterator[SshRelay]:
    relay = SshRelay(ssh_target.port)
    try:
        yield relay
    finally:
        relay.close()


@pytest.fixture
def environment(make_cluster: Any, cell: Cell, alice: User, relay: SshRelay) -> Environment:  # noqa: F811
    """The sessions' cluster, its SSH through the relay."""
    cluster = make_cluster(name="sessions", shared=False, scheduler=cell.kind, port=relay.port)
    return compute_environment(cluster, cell, walltime="00:15:00")


def test_a_start_cut_off_by_a_dropped_ssh_connection_starts_again_with_one_program(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
    relay: SshRelay,
) -> None:
    # Given: alice's connected worker, its cluster's SSH server slow to answer.
    worker_id = worker_of(pw)
    owner = sorted(ssh_target.accounts)[0]
    relay.hold(HELD)
    try:
        # When: she asks for a desktop on the worker, and the connection drops once the start
        # command has run on the login host (its step's client is there), its answer unread.
        asked = pw(
            "sessions", "create", "--type", "desktop", "sessions", "--worker", worker_id,
            "-o", "json",
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        session_id = json.loads(asked.stdout)["id"]
        started = poll(
            lambda: processes_of(owner, f"--activate-session\0{session_id}"),
            timeout=60,
            interval=0.01,
        )
        assert started, session_state(session_id).events.all()
    finally:
        relay.hold(0)
        dropped = relay.cut()
    print(f"start command's processes {started}; {dropped} connection(s) dropped")
    # The first start's launcher gets going on the node all the same.
    assert poll(lambda: launchers(owner, session_id), timeout=30)

    # Then: the session starts again on its own and runs; its history says why it started twice.
    wait_for(lambda: session_state(session_id).status in {"running", "failed"}, timeout=120)
    session = session_state(session_id)
    assert (session.status, session.status_reason) == ("running", ""), session.status_reason
    reasons = [e.reason for e in session.events.all()]
    retried = [r for r in reasons if r.startswith(RETRYING)]
    print(f"the session's history: {reasons}")
    assert len(retried) == 1 and "broke" in retried[0], reasons
    # One program on the node, the one the platform knows: the cut start's ended.
    found = poll(lambda: launchers(owner, session_id) == [session.node_pid], timeout=30)
    assert found, (launchers(owner, session_id), session.node_pid, processes_of(owner, session_id))
    listed = json.loads(pw("sessions", "ls", "--worker", worker_id, "-o", "json").stdout)
    url = next(s["url"] for s in listed if s["id"] == session_id)
    _, key = ApiKey.issue(alice)
    answer = httpx.get(url + "vnc.html", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200

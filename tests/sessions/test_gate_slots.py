"""No slot a neighbour can hold at a session's gate: another Unix user of the node (``pwbob``,
never root) holds 100 connections to the session launcher's port, a byte every 5 s on each and
every closed one opened again within a second, for three heartbeat timeouts; the owner's
requests to her session keep answering. Real Slurm over real SSH, a real JupyterLab."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from tests.e2e.test_relay_slots import HOLD, hold_slots
from tests.sessions.test_jupyter_neighbour import running_jupyter
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]


def test_a_neighbour_holding_the_gates_connections_leaves_the_owners_session_answering(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner = sorted(ssh_target.accounts)[0]
    session, _ = running_jupyter(pw, owner)
    state = session_state(session["id"])
    _, key = ApiKey.issue(alice)
    url = session["url"] + "api/status"
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        assert client.get(url).status_code == 200

        # Given: the neighbour holds 100 connections to the session's gate on the node.
        holder = hold_slots(state.node_host, state.node_port, 100, every=5, seconds=HOLD + 4)
        wait_for(lambda: holder.said("TICK"), timeout=30, interval=0.1)
        held_at_start = holder.said("TICK")[0]

        # When: it keeps them for three heartbeat timeouts, while the owner uses her session.
        answers: list[tuple[int, float]] = []
        started = time.monotonic()
        while time.monotonic() - started < HOLD:
            asked = time.monotonic()
            try:
                status = client.get(url).status_code
            except httpx.HTTPError:
                status = 0
            answers.append((status, time.monotonic() - asked))
            time.sleep(0.5)
        holder.finish(timeout=30)
        summary = holder.said("DONE")

    # Then: every one of her requests was answered by her program.
    failed = [status for status, _ in answers if status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed}"
    took = [seconds for _, seconds in answers]
    print(
        f"\nneighbour ({held_at_start}; {summary[0] if summary else '?'}) held the gate for "
        f"{HOLD:g}s: {len(answers)} requests of the owner all answered 200 in "
        f"{min(took):.3f} to {max(took):.3f}s"
    )
    pw("sessions", "stop", session["id"])

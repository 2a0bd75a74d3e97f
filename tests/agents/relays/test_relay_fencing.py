"""A relay keeper paused past its lease (SIGSTOP) and continued does nothing beside the one that
took over: two real `run_relays` processes, the real login host (the test cluster's sshd)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agents.relays.lease import Lease
from core.redis_connection import redis_client
from harness.platform import Platform
from harness.relays import relay_pids
from harness.waiting import wait_for
from workers_app.models import AgentRelay, AgentRoute, RelayState
from workers_app.relays import relay_tag

pytestmark = [pytest.mark.slurm, pytest.mark.live]

LEASE = 2.0
KNOBS = {"ACTIVATE_RELAY_LEASE": f"{LEASE:g}", "ACTIVATE_RELAY_CHECK_INTERVAL": "0.5"}


def test_a_keeper_paused_past_its_lease_and_continued_leaves_its_successor_s_relay_alone(
    transactional_db: None, make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(
        name="fenced-relay", agent_route=AgentRoute.VIA_LOGIN_HOST, relay_host="127.0.0.1"
    )
    tag = relay_tag(cluster)
    lease_key = Lease(cluster.pk).key
    platform = Platform(workdir=tmp_path, knobs=KNOBS)

    def row() -> AgentRelay:
        return AgentRelay.objects.get(cluster=cluster)

    def kept_by(pid: int) -> bool:
        relay = AgentRelay.objects.filter(cluster=cluster).first()
        return (
            relay is not None and relay.state == RelayState.UP and relay.holder.endswith(f":{pid}")
        )

    first = platform.start_relays("relays-a")
    try:
        # Given a run_relays process keeping the cluster's relay, and another standing by
        wait_for(lambda: kept_by(first.pid), timeout=30)
        second = platform.start_relays("relays-b")
        time.sleep(LEASE)
        assert kept_by(first.pid)
        # When the keeper is paused for twice its lease, and the other takes over
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(2 * LEASE)
        wait_for(lambda: kept_by(second.pid), timeout=30)
        taken = redis_client().get(lease_key)
        assert taken is not None and f":{second.pid}:".encode() in taken
        relays = relay_pids(tag)
        assert len(relays) == 1
        # and the paused one continues
        os.kill(first.pid, signal.SIGCONT)
        # Then for three leases it does nothing: the successor keeps its lease (the same
        # fence), its row and its one relay on the login host
        until = time.monotonic() + 3 * LEASE
        while time.monotonic() < until:
            assert redis_client().get(lease_key) == taken
            assert kept_by(second.pid), row().holder
            assert relay_pids(tag) == relays
            time.sleep(0.05)
        assert platform.log_count("lease lost; another supervisor keeps it") >= 1
        assert first.poll() is None  # continued, standing by
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
        platform.stop_all()

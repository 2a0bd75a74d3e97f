"""Fencing the beat lease (core/lease.py, core/beat.py): each taking draws a new fence, beat's
sends carry it, and a sweep sent under a fence that is no longer the lease's does nothing, up
to a real beat process paused mid-send past its lease and continued after another took over.
Against the tests' real Redis, and a real sweeper for the paused holder."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.apps import apps

from activate.celery import app as platform_app
from core import lease as leases
from core import sweep_lag
from core.beat import FENCE_HEADER, BeatLease, FencedTask, LeasedScheduler, lease_key
from core.redis_connection import redis_client
from harness import REPO
from harness.platform import Platform
from harness.waiting import wait_until
from workers_app import tasks

LEASE = 2.0


def refused() -> int:
    return leases.refused(redis_client(), lease_key())


def test_each_taking_draws_a_new_fence_and_a_renewal_keeps_it() -> None:
    # Given a holder that took the lease
    first = BeatLease(redis_client(), lease_key(), 0.3, token="first")
    assert first.hold()
    taken = first.number
    # When it renews, then another takes the lease once released, then lapsed and taken again
    assert first.hold() and first.number == taken
    assert redis_client().get(lease_key()) == f"first#{taken}".encode()
    assert first.release()
    second = BeatLease(redis_client(), lease_key(), 0.3, token="second")
    assert second.hold()
    after_release = second.number
    time.sleep(0.4)
    assert second.hold()
    # Then every taking had a number of its own, rising, and the value names holder and number
    assert taken < after_release < second.number
    assert second.holder() == f"second#{second.number}"
    # and the old holding cannot release the new one
    assert not BeatLease(redis_client(), lease_key(), 0.3, token="second").release()
    assert second.holder() is not None


def test_a_sweep_carrying_the_lease_s_fence_runs_and_a_stale_one_is_refused_and_counted(
    db: None,
) -> None:
    # Given a holding that replaced an earlier one
    paused = BeatLease(redis_client(), lease_key(), 0.2, token="paused")
    assert paused.hold()
    stale = paused.fence
    time.sleep(0.3)
    successor = BeatLease(redis_client(), lease_key(), LEASE, token="successor")
    assert successor.hold()
    # When the paused holder's sweep lands
    result = tasks.sweep_heartbeats.apply(headers={FENCE_HEADER: stale})
    # Then it did nothing, and was counted
    assert result.get() is None
    assert sweep_lag.sweep_lag()["heartbeats"] is None
    assert refused() == 1
    # When the successor's lands, it sweeps
    tasks.sweep_heartbeats.apply(headers={FENCE_HEADER: successor.fence})
    assert sweep_lag.sweep_lag()["heartbeats"] is not None
    # A sweep sent by no leased beat (the lease off, by hand) runs as before.
    tasks.sweep_timeouts.apply()
    assert sweep_lag.sweep_lag()["timeouts"] is not None
    assert refused() == 1


@pytest.mark.parametrize(
    "task",
    [
        "sessions_app.tasks.sweep_sessions",
        "sessions_app.tasks.sweep_idle_sessions",
        "notices_app.tasks.warn_walltimes",
        "workers_app.tasks.sweep_idle",
    ],
)
def test_every_scheduled_task_of_every_app_sent_under_a_stale_fence_does_nothing(
    db: None, task: str
) -> None:
    # Given a holding replaced by another, and a scheduled task of any app the paused one sent
    paused = BeatLease(redis_client(), lease_key(), 0.2, token="paused")
    assert paused.hold()
    time.sleep(0.3)
    assert BeatLease(redis_client(), lease_key(), LEASE, token="successor").hold()
    module, _, name = task.rpartition(".")
    scheduled = getattr(importlib.import_module(module), name)
    ran: list[str] = []
    run = scheduled.run
    scheduled.run = lambda *a, **k: ran.append(task)  # what it would have done
    try:
        # When it lands with the stale fence, and again with none (by hand)
        scheduled.apply(headers={FENCE_HEADER: paused.fence})
        refused_then = refused()
        scheduled.apply()
    finally:
        scheduled.run = run
    # Then the fenced one did nothing and was counted; the other ran
    assert refused_then == 1 and ran == [task]


def test_every_task_is_of_the_fenced_class() -> None:
    # A task added to any app gets the check without saying so.
    for app in apps.get_app_configs():
        if importlib.util.find_spec(f"{app.name}.tasks") is not None:
            importlib.import_module(f"{app.name}.tasks")
    assert len(platform_app.tasks) > 20
    assert [name for name, t in platform_app.tasks.items() if not isinstance(t, FencedTask)] == []


def test_a_sweep_whose_sender_s_lease_lapsed_with_nobody_holding_it_is_refused(db: None) -> None:
    gone = BeatLease(redis_client(), lease_key(), 0.2, token="gone")
    assert gone.hold()
    time.sleep(0.3)
    tasks.sweep_heartbeats.apply(headers={FENCE_HEADER: gone.fence})
    assert sweep_lag.sweep_lag()["heartbeats"] is None
    assert refused() == 1


def test_the_holder_s_sends_carry_its_fence_in_their_message(tmp_path: Path, settings: Any) -> None:
    # Given a leased beat whose one entry is due every 0.1 s, publishing to the real broker
    settings.ACTIVATE_BEAT_LEASE = LEASE
    beat_app = Celery("fence-test", broker=settings.REDIS_URL, set_as_current=False)
    beat_app.conf.beat_schedule = {"probe": {"task": "probe", "schedule": 0.1}}
    beat_app.conf.task_default_queue = "fence-test"
    scheduler = LeasedScheduler(app=beat_app, schedule_filename=str(tmp_path / "beat"))
    client = redis_client()
    try:
        # When it ticks for a while
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            scheduler.tick()
            time.sleep(0.02)
        # Then every message it published carries its holding's fence
        assert scheduler.lease is not None
        messages = [json.loads(raw) for raw in client.lrange("fence-test", 0, -1)]
        assert messages
        assert {m["headers"][FENCE_HEADER] for m in messages} == {scheduler.lease.fence}
    finally:
        scheduler.close()
        client.delete("fence-test")


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
    except OSError:
        return False


@pytest.fixture
def sweeper(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_sweeper()
        yield platform
    finally:
        platform.stop_all()


@pytest.mark.live
def test_a_beat_paused_mid_send_past_its_lease_and_continued_sweeps_nothing(
    sweeper: Platform, tmp_path: Path
) -> None:
    # Given a real beat process that took the lease and stopped (SIGSTOP) as it sent a sweep
    environ = {**sweeper.env(), "ACTIVATE_BEAT_LEASE": f"{LEASE:g}"}
    log = tmp_path / "paused-beat.log"
    with log.open("ab") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "tests.foundation.paused_beat", str(tmp_path / "schedule")],
            cwd=REPO,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    renewing = threading.Event()
    try:
        assert wait_until(lambda: _stopped(beat.pid), timeout=30), log.read_text()
        paused_fence = redis_client().get(lease_key())
        assert paused_fence is not None and f":{beat.pid}:".encode() in paused_fence
        # and another beat took the lease once it lapsed, and keeps it
        successor = BeatLease(redis_client(), lease_key(), LEASE, token="successor")
        assert wait_until(successor.hold, timeout=2 * LEASE)

        def renew() -> None:
            while not renewing.wait(0.1 * LEASE):
                successor.hold()

        threading.Thread(target=renew, daemon=True).start()
        # When the paused beat continues
        os.kill(beat.pid, signal.SIGCONT)
        # Then the sweep it sent with its old fence is refused where it lands, and nothing swept
        assert wait_until(lambda: refused() >= 1, timeout=30), sweeper.logs()
        time.sleep(LEASE)
        assert refused() == 1
        assert sweep_lag.sweep_lag()["heartbeats"] is None
        assert sweeper.log_count("refused: the beat lease is not its any more") == 1
        assert "continued" in log.read_text()
        # and the successor's sweep, through the same sweeper, runs
        tasks.sweep_heartbeats.apply_async(headers={FENCE_HEADER: successor.fence})
        assert wait_until(lambda: sweep_lag.sweep_lag()["heartbeats"] is not None, timeout=30)
        assert successor.holder() == successor.fence
    finally:
        renewing.set()
        if beat.poll() is None:
            os.kill(beat.pid, signal.SIGCONT)
            beat.kill()
        beat.wait()

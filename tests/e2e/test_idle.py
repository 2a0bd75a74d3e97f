# ruff: noqa: F811 - pytest fixtures imported by name are parameters of the tests
"""Idle workers and sessions on the real Slurm, with the knobs in seconds: measured on the node
by the agent (the job's own processes), by the terminals open on the worker, and by the traffic
of its sessions through the proxy; the policy warns, Keep starts the clock again, and then the
worker is deleted with its reason and its job leaves squeue."""

from __future__ import annotations

import json
import os
import pty
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from harness.platform import Platform
from harness.waiting import wait_for
from sessions_app.models import Session
from tests.e2e.conftest import PW
from tests.e2e.test_terminal import pw_env, read_until
from tests.platforms import module_platform
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    in_squeue,
    pw,
    session_tools,
)
from workers_app.models import ApiKey, Worker
from workers_app.statuses import WorkerStatus

pytestmark = [pytest.mark.slurm, pytest.mark.live]

POLICY_MINUTES = 0.2  # 12 s: warned after 8 s quiet (the 4 s warning's lead), deleted at 12 s
WARNING = 4.0
IDLE_KNOBS = {
    "ACTIVATE_ACTIVITY_INTERVAL": "1",
    "ACTIVATE_IDLE_SHORTEST": "1",
    "ACTIVATE_IDLE_WARNING": str(WARNING),
    "ACTIVATE_IDLE_SWEEP_INTERVAL": "1",
}


# The node's own CPU and I/O never count as busy: a 40 MiB download read from the node's disk
# (some 1.6 MB/s) is far above ACTIVATE_IDLE_IO's 64 KiB/s, and would keep its worker busy
# without the proxy.
NODE_NEVER_BUSY = {**IDLE_KNOBS, "ACTIVATE_IDLE_CPU": "1000", "ACTIVATE_IDLE_IO": "1e15"}
# How late a sweep may act past its moment: the idle sweep runs every second (Celery beat), and
# a loaded 2-core machine delays it.
SWEEP_LATE = 3.0


# Shared by the serial tests, which run one after another.
shared_idle_platform = module_platform(knobs=IDLE_KNOBS)


@pytest.fixture
def session_platform(transactional_db: None, shared_idle_platform: Platform) -> Platform:
    return shared_idle_platform


@pytest.fixture
def proxy_only_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    with Platform(workdir=tmp_path, knobs=NODE_NEVER_BUSY).running() as running:
        yield running


def new_worker(pw: Any, *extra: str) -> Worker:
    result = pw(
        "workers", "create", "sessions", "--environment", "compute", "--wait", "-o", "json", *extra
    )
    assert result.returncode == 0, result.stderr
    return Worker.objects.get(public_id=json.loads(result.stdout)["id"])


class Terminal:
    """`pw ssh` in a pty of its own (a kept terminal when ``keep``): what a person types."""

    def __init__(self, env: dict[str, str], worker: Worker, keep: str = "") -> None:
        argv = [str(PW), "ssh", *(["--keep", keep] if keep else []), worker.public_id]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(argv[0], argv, env)  # noqa: S606

    def run(self, line: str, until: str) -> None:
        os.write(self.fd, line.encode() + b"\n")
        read_until(self.fd, until.encode(), timeout=60)

    def drop(self) -> None:
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def state(worker: Worker) -> Worker:
    worker.refresh_from_db()
    return worker


def api_worker(platform: Platform, key: str, worker: Worker) -> dict[str, Any]:
    answer = httpx.get(
        f"{platform.url}/api/workers/{worker.public_id}/",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


# Serial: beside the parallel run its warning missed the test's minute (CI, 2026-12-06).
@pytest.mark.serial
def test_a_sleeping_worker_is_warned_kept_warned_again_and_deleted_with_its_reason(
    session_platform: Platform,
    pw: Any,
    alice: User,
    tmp_path: Path,
) -> None:
    # Given: a worker with a 12 s idle policy whose only program is `sleep`, left running in a
    # kept terminal whose connection then drops.
    worker = new_worker(pw, "--idle-minutes", str(POLICY_MINUTES))
    job_id = worker.scheduler_job_id
    terminal = Terminal(pw_env(session_platform, alice, tmp_path / "t"), worker, keep="sleeper")
    terminal.run("echo started-$((6*7)); sleep 600", until="started-42")
    terminal.drop()

    # Then: it is seen idle, and its owner is warned (a notice with Keep), not yet deleted.
    wait_for(lambda: state(worker).idle_warned_at is not None, timeout=60)
    assert worker.status == WorkerStatus.CONNECTED
    assert worker.notices.filter(kind="idle").exists()
    listed = pw("workers", "ls")
    row = next(line for line in listed.stdout.splitlines() if worker.public_id in line)
    assert "m " in row or row.split()[-3].endswith("m"), listed.stdout

    # When: she keeps it. Then: the warning is gone, and the clock starts again from Keep.
    kept = pw("workers", "keep", worker.public_id)
    assert kept.returncode == 0, kept.stderr
    assert state(worker).idle_warned_at is None and worker.idle_kept_at is not None
    assert not worker.notices.filter(kind="idle").exists()
    kept_at = worker.idle_kept_at
    wait_for(lambda: state(worker).idle_warned_at is not None, timeout=60)
    warned_after = (worker.idle_warned_at - kept_at).total_seconds()
    assert 12 - WARNING <= warned_after <= 12 - WARNING + SWEEP_LATE, warned_after

    # And then, still quiet, it is deleted with its reason, a warning's lead after it was
    # warned; its job leaves squeue.
    wait_for(lambda: state(worker).status != WorkerStatus.CONNECTED, timeout=60)
    assert worker.status_reason == "Deleted after 0.2 minutes idle"
    assert worker.idle_warned_at is not None
    left = worker.events.get(old_status=WorkerStatus.CONNECTED)
    waited = (left.at - worker.idle_warned_at).total_seconds()
    assert WARNING <= waited <= WARNING + SWEEP_LATE, waited
    print(f"\nwarned {warned_after:.2f} s after Keep, deleted {waited:.2f} s after the warning")
    wait_for(lambda: not in_squeue(job_id), timeout=60)


# The loop's share of a core is measured (0.15 beside a parallel run's load).
@pytest.mark.serial
def test_a_cpu_loop_and_an_open_terminal_are_not_idle(
    session_platform: Platform,
    pw: Any,
    alice: User,
    tmp_path: Path,
) -> None:
    _, key = ApiKey.issue(alice)
    env = pw_env(session_platform, alice, tmp_path / "t")
    # Given: one worker running a CPU loop in a kept terminal (its connection dropped), and one
    # with a terminal open and nothing typed; both with the 12 s idle policy.
    looping = new_worker(pw, "--idle-minutes", str(POLICY_MINUTES))
    loop = Terminal(env, looping, keep="loop")
    loop.run("echo looping-$((6*7)); python3 -c 'while True: pass'", until="looping-42")
    loop.drop()
    watched = new_worker(pw, "--idle-minutes", str(POLICY_MINUTES))
    shell = Terminal(env, watched)
    shell.run("echo open-$((6*7))", until="open-42")
    try:
        # When: twice the policy goes by (a warning would come 8 s into it).
        deadline = time.monotonic() + 2 * 12
        while time.monotonic() < deadline:
            # Then: neither is ever warned nor deleted, nor shown idle.
            for what, worker in {"cpu loop": looping, "open terminal": watched}.items():
                assert state(worker).status == WorkerStatus.CONNECTED, (what, worker.status_reason)
                assert worker.idle_warned_at is None, what
                shown = api_worker(session_platform, key, worker)
                assert shown["idle_since"] is None, (what, shown["idle_since"], shown["activity"])
            time.sleep(1)
        # The loop's share of a core, as reported: at least a tenth even with this 2-core
        # machine at a load of 17 (0.19 and 0.27 seen there), twice ACTIVATE_IDLE_CPU.
        activity = api_worker(session_platform, key, looping)["activity"]
        assert activity is not None and activity["cpu"] >= 0.1, activity
    finally:
        shell.drop()
    # The terminal closed, the second worker has nothing left: it is warned in turn.
    wait_for(lambda: state(watched).idle_warned_at is not None, timeout=60)
    assert state(looping).idle_warned_at is None


def test_a_long_transfer_through_a_session_keeps_its_worker_busy(
    proxy_only_platform: Platform, pw: Any, alice: User, tmp_path: Path
) -> None:
    # Given: JupyterLab on a worker of alice's whose policy is 18 s idle (warned at 14 s), on a
    # platform where nothing the node does counts as busy: only the proxy's traffic can. She
    # makes a 40 MiB file in her home in a terminal, open (busy) until the session runs.
    policy, lead = 18.0, WARNING
    worker = new_worker(pw, "--idle-minutes", str(policy / 60))
    terminal = Terminal(pw_env(proxy_only_platform, alice, tmp_path / "t"), worker)
    terminal.run("head -c 41943040 /dev/urandom > big.bin; echo made-$((6*7))", until="made-42")
    session, _ = created(pw, "--type", "jupyter", "sessions", "--worker", worker.public_id)
    _, key = ApiKey.issue(alice)
    auth = {"Authorization": f"Bearer {key}"}
    terminal.drop()

    # When: she downloads it through the session slowly, for longer than the policy.
    started, received = time.monotonic(), 0
    with httpx.stream("GET", session["url"] + "files/big.bin", headers=auth, timeout=60) as got:
        assert got.status_code == 200
        for chunk in got.iter_bytes(65536):
            received += len(chunk)
            time.sleep(0.04)  # about 1.6 MB/s: some 25 s for the file
            # Then: all along, the worker is never warned (the loopback's socket buffers hold
            # a few seconds of the file past the proxy: less than the 14 s to a warning).
            assert state(worker).idle_warned_at is None, f"warned after {received} bytes"
            assert worker.status == WorkerStatus.CONNECTED
    ended = timezone.now()
    took = time.monotonic() - started
    assert received == 41943040 and took > policy, (received, took)

    # Afterwards, with nothing going on, it is warned in turn: 14 s after the proxy's last
    # bytes (which left it up to the socket buffers' few seconds before she read them).
    wait_for(lambda: state(worker).idle_warned_at is not None, timeout=60)
    assert worker.idle_warned_at is not None
    quiet = (worker.idle_warned_at - ended).total_seconds()
    assert policy - lead - 5 <= quiet <= policy - lead + SWEEP_LATE, quiet
    print(f"\ndownload took {took:.1f} s; warned {quiet:.1f} s after it ended")


# Serial: beside the parallel run its warning missed the test's minute (CI, 2026-12-06).
@pytest.mark.serial
def test_a_quiet_session_is_warned_then_ended_with_its_reason_and_its_worker_stays(
    session_platform: Platform, pw: Any, alice: User
) -> None:
    # Given: JupyterLab, to be ended after 12 s idle, on a worker of alice's with no policy.
    worker = new_worker(pw)
    session, _ = created(
        pw, "--type", "jupyter", "sessions", "--worker", worker.public_id, "--idle-minutes", "0.2"
    )
    record = Session.objects.get(public_id=session["id"])

    # When: nobody uses it. Then: warned, kept by her once, warned again and ended.
    wait_for(lambda: Session.objects.get(pk=record.pk).idle_warned_at is not None, timeout=60)
    kept = pw("sessions", "keep", session["id"])
    assert kept.returncode == 0, kept.stderr
    record.refresh_from_db()
    assert record.idle_warned_at is None and record.idle_kept_at is not None
    wait_for(lambda: Session.objects.get(pk=record.pk).status != "running", timeout=60)
    record.refresh_from_db()
    assert (record.status, record.status_reason) == ("ended", "Ended after 0.2 minutes idle")
    assert record.ended_at is not None and record.idle_kept_at is not None
    assert record.idle_warned_at is not None
    # Warned a warning's lead before the 12 s, and ended that lead after the warning.
    warned_after = (record.idle_warned_at - record.idle_kept_at).total_seconds()
    assert 12 - WARNING <= warned_after <= 12 - WARNING + SWEEP_LATE, warned_after
    ended_after = (record.ended_at - record.idle_warned_at).total_seconds()
    assert WARNING <= ended_after <= WARNING + SWEEP_LATE, ended_after
    print(f"\nsession warned {warned_after:.2f} s after Keep, ended {ended_after:.2f} s later")
    assert state(worker).status == WorkerStatus.CONNECTED

"""2 GiB up and down through the live web server keep its memory flat and its event loop free:
the web process's peak resident memory grows less than 64 MiB over what it held before, while
an agent's heartbeats to the same process keep being answered."""

from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from tests.agents.heartbeats.signed import worker_with_key
from tests.files import places
from tests.files.places import CLUSTER, people_on
from workers_app.models import ApiKey, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.live, pytest.mark.serial]
SIZE = 2 * 1024**3
BLOCK = 1024 * 1024
GROWTH_LIMIT = 64 * 1024 * 1024
workspace = places.workspace  # a fixture


def memory(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def web_pid(platform: Platform) -> int:
    """The uvicorn process serving requests (the only one with one worker)."""
    pids = [platform.processes["web"].pid, *platform.child_pids("web")]
    return max(pids, key=lambda pid: memory(pid).get("VmRSS", 0))


def reset_peak(pid: int) -> int:
    """Start counting the peak anew (root may); the resident memory now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return memory(pid)["VmRSS"]


class Beats:
    """A connected worker's agent beating the web server every 0.1 s, timed."""

    def __init__(self, platform: Platform) -> None:
        worker, self.agent = worker_with_key()
        self.client = httpx.Client(base_url=platform.url, timeout=30)
        body = {"worker": worker.public_id, "hostname": "node7"}
        assert self.agent.post(self.client, "/agent/v1/connect", body).status_code == 200
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            started = time.perf_counter()
            try:
                ok = self.agent.post(self.client, "/agent/v1/heartbeat").status_code == 200
            except httpx.HTTPError:
                ok = False
            self.latencies.append(time.perf_counter() - started)
            self.failures += not ok

    def __enter__(self) -> Beats:
        self.latencies, self.failures = [], 0
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def said(self) -> str:
        ordered = sorted(self.latencies)
        p99 = ordered[int(len(ordered) * 0.99) - 1] if ordered else float("nan")
        return (
            f"{len(ordered)} beats, median {statistics.median(ordered) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms, {self.failures} failed"
        )


@pytest.fixture
def platform(
    transactional_db: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    running = Platform(workdir=tmp_path_factory.mktemp("files-memory"))
    running.start_web()
    try:
        yield running
    finally:
        running.stop_all()


@pytest.fixture
def alice(platform: Platform, make_cluster: Any, ssh_target: SshTarget) -> User:
    cluster: Cluster = make_cluster(name=CLUSTER, shared=False)
    return people_on(cluster, ssh_target)["alice"]


def test_two_gib_each_way_keep_the_web_process_flat_and_heartbeats_answered(
    platform: Platform, alice: User, workspace: Path
) -> None:
    _, key = ApiKey.issue(alice)
    pid = web_pid(platform)
    beats = Beats(platform)
    seed = os.urandom(BLOCK)
    sent = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for index in range(SIZE // BLOCK):
            block = index.to_bytes(8, "big") + seed[8:]
            sent.update(block)
            yield block

    params = {"path": f"{workspace}/big.bin"}
    with beats:
        time.sleep(3)  # the same beats with nothing else going on, to compare with
    quiet_beats = beats.said()
    with platform.api(key, timeout=120) as client:
        before = reset_peak(pid)
        started = time.perf_counter()
        with beats:
            put = client.put(
                f"/files/{CLUSTER}/upload",
                params=params,
                content=body(),
                headers={"Content-Length": str(SIZE)},
            )
        up_seconds = time.perf_counter() - started
        up_growth = memory(pid)["VmHWM"] - before
        up_beats, up_failed = beats.said(), beats.failures
        assert put.status_code == 201, put.text

        before = reset_peak(pid)
        received = hashlib.sha256()
        count = 0
        started = time.perf_counter()
        with beats, client.stream("GET", f"/files/{CLUSTER}/download", params=params) as got:
            assert got.status_code == 200
            for piece in got.iter_bytes(BLOCK):
                received.update(piece)
                count += len(piece)
        down_seconds = time.perf_counter() - started
        down_growth = memory(pid)["VmHWM"] - before
        down_beats = beats.said()

    mib = 1024 * 1024
    print(
        f"\nheartbeats with no transfer: {quiet_beats}"
        f"\nupload 2 GiB: {SIZE / up_seconds / 1e6:.0f} MB/s, web RSS peak +{up_growth / mib:.1f}"
        f" MiB; heartbeats meanwhile: {up_beats}\n"
        f"download 2 GiB: {SIZE / down_seconds / 1e6:.0f} MB/s, web RSS peak "
        f"+{down_growth / mib:.1f} MiB; heartbeats meanwhile: {down_beats}"
    )
    assert (workspace / "big.bin").stat().st_size == SIZE
    assert count == SIZE and received.digest() == sent.digest()
    assert up_growth < GROWTH_LIMIT and down_growth < GROWTH_LIMIT
    assert up_failed == 0 and beats.failures == 0

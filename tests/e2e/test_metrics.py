"""/metrics during a real worker's life: real web and agents' servers, Celery worker, sweeper and
beat writing to one metrics directory (prometheus_client's multiprocess mode), the real Slurm
over SSH. The counters move because those processes recorded them: this test process records
nothing, and the directory holds their files, not its."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from websockets.sync.client import connect

from harness.platform import SHIPPED, Platform
from harness.waiting import wait_for
from tests.workers.metrics.scraping import samples, value
from workers_app.actions import deletion, requests
from workers_app.models import ApiKey, Environment, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]
TOKEN = secrets.token_hex(24)


@pytest.fixture
def metrics_dir(tmp_path: Path) -> Path:
    path = tmp_path / "metrics"
    path.mkdir()
    return path


@pytest.fixture
def platform(transactional_db: None, tmp_path: Path, metrics_dir: Path) -> Iterator[Platform]:
    knobs = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "ACTIVATE_METRICS_TOKEN": TOKEN}
    # scripts/start.sh's numbers: each server's several processes write files of their own.
    with Platform(workdir=tmp_path, knobs=knobs, shape=SHIPPED).running() as running:
        yield running


def scrape(platform: Platform) -> str:
    answer = httpx.get(
        f"{platform.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer.text


def metric(text: str, name: str, **labels: str) -> float:
    return value(text, name, **labels) or 0.0


def cancels(text: str, cluster: str) -> float:
    """Cancel attempts on the cluster, whatever their outcome."""
    return sum(
        count
        for (name, labels), count in samples(text).items()
        if name == "activate_cancels_total" and ("cluster", cluster) in labels
    )


def session_cookie(*, staff: bool) -> dict[str, str]:
    """A logged-in browser's cookie for the live server (sessions are in the shared database)."""
    name = "operator" if staff else "someone"
    user = get_user_model().objects.create_user(name, password="pw-12345678", is_staff=staff)
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


class Files:
    """The files of some processes only, read as the web server reads them all."""

    def __init__(self, metrics_dir: Path, pids: set[int]) -> None:
        self.files = [
            str(path)
            for path in metrics_dir.glob("*.db")
            if int(path.stem.rsplit("_", 1)[1]) in pids
        ]

    def collect(self) -> Iterable[Metric]:
        return MultiProcessCollector.merge(self.files, accumulate=True)


def files_of(metrics_dir: Path, pids: set[int]) -> str:
    registry = CollectorRegistry()
    registry.register(Files(metrics_dir, pids))
    return generate_latest(registry).decode()


def recorded_here(name: str, **labels: str) -> float:
    """What this test process recorded itself (it has no metrics directory)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_only_staff_or_the_token_read_the_metrics_of_the_live_platform(
    platform: Platform,
) -> None:
    url = f"{platform.url}/metrics"
    assert httpx.get(url, timeout=30).status_code == 403
    wrong = {"Authorization": f"Bearer {secrets.token_hex(24)}"}
    assert httpx.get(url, headers=wrong, timeout=30).status_code == 403
    user = session_cookie(staff=False)
    assert httpx.get(url, cookies=user, timeout=30).status_code == 403
    staff = httpx.get(url, cookies=session_cookie(staff=True), timeout=30)
    assert staff.status_code == 200
    assert staff.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "activate_workers" in scrape(platform)


def test_a_worker_s_life_moves_the_counters_the_processes_recorded(
    platform: Platform, environment: Environment, user, metrics_dir: Path
) -> None:
    cluster = environment.cluster.name
    # Given the platform's metrics before anything happened
    before = scrape(platform)
    beats_here = recorded_here("activate_heartbeats_received_total")
    connected_here = recorded_here("activate_request_to_connected_seconds_count", cluster=cluster)
    assert metric(before, "activate_workers", cluster=cluster, status="connected") == 0
    # When a worker is requested and connects
    requested = time.monotonic()
    worker = requests.request_worker(
        owner=user, cluster=cluster, environment=environment.name, params={}
    )
    wait_for(lambda: Worker.objects.get(pk=worker.pk).status == S.CONNECTED, timeout=120)
    took = time.monotonic() - requested
    # ...and its agent has beaten a few times (every second), the heartbeat sweep has run
    wait_for(
        lambda: (
            metric(scrape(platform), "activate_heartbeats_received_total")
            >= metric(before, "activate_heartbeats_received_total") + 3
        ),
        timeout=30,
    )
    during = scrape(platform)
    # Then it is one connected worker, one submission, one wait from request to connected
    assert metric(during, "activate_workers", cluster=cluster, status="connected") == 1
    assert metric(during, "activate_workers", cluster=cluster, status="pending") == 0
    submitted = {"cluster": cluster, "outcome": "submitted"}
    assert metric(during, "activate_submissions_total", **submitted) == (
        metric(before, "activate_submissions_total", **submitted) + 1
    )
    connected = "activate_request_to_connected_seconds"
    assert metric(during, f"{connected}_count", cluster=cluster) == 1
    waited = metric(during, f"{connected}_sum", cluster=cluster)
    assert 0 < waited <= took + 1
    assert metric(during, "activate_heartbeats_refused_total", status="401") == 0
    # ...the poll ran over SSH and the Celery processes hold a connection to the cluster
    assert metric(during, "activate_poll_cycle_seconds_count", cluster=cluster) >= 1
    assert metric(during, "activate_poll_commands_sum", cluster=cluster) >= 1
    assert metric(during, "activate_ssh_connections", cluster=cluster) >= 1
    lag = value(during, "activate_sweep_lag_seconds", kind="heartbeats")
    assert lag is not None and lag < 10

    # When its owner opens a terminal on it, then closes it
    _, key = ApiKey.issue(user)
    url = platform.url.replace("http", "ws") + f"/ws/workers/{worker.public_id}/terminal/"
    start = {"type": "start", "command": ["sleep", "60"], "pty": False, "cols": 80, "rows": 24}
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as terminal:
        terminal.send(json.dumps(start))
        assert json.loads(terminal.recv(timeout=30))["type"] == "started"
        # Then it is counted while open (by whichever web process holds it), and not after
        assert metric(scrape(platform), "activate_terminals_open") == 1
    wait_for(lambda: metric(scrape(platform), "activate_terminals_open") == 0, timeout=15)

    # And those numbers are the platform's processes' own: the agents' server's files hold the
    # beats, and nothing here came from this test process, which wrote no file and beat never
    agents = set(platform.child_pids("agents"))
    assert metric(files_of(metrics_dir, agents), "activate_heartbeats_received_total") >= 3
    assert not list(metrics_dir.glob(f"*_{os.getpid()}.db"))
    assert recorded_here("activate_heartbeats_received_total") == beats_here
    assert recorded_here(f"{connected}_count", cluster=cluster) == connected_here

    # When the worker is deleted
    deletion.delete_worker(worker)
    wait_for(lambda: Worker.objects.get(pk=worker.pk).status == S.STOPPED, timeout=60)
    after = scrape(platform)
    # Then it is no longer counted, and the attempt to cancel its job is (scancel's answer
    # decides the outcome: cancelled, or still listed while Slurm completes it)
    assert metric(after, "activate_workers", cluster=cluster, status="connected") == 0
    assert metric(after, "activate_workers", cluster=cluster, status="stopping") == 0
    assert cancels(after, cluster) >= cancels(before, cluster) + 1

"""/metrics: who may read it, and what is read when it is asked (the database's counts, the
sweeps' and breakers' marks in Redis), against PostgreSQL and Redis. Each check reads the
exposition as Prometheus parses it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from core import metrics as families
from core import sweep_lag
from core.metrics import scrape, views
from harness.agents import SignedAgent
from harness.cluster import SshTarget
from sessions_app.models import Session
from sessions_app.statuses import SessionStatus
from tests.agents.heartbeats.signed import django_post, worker_with_key
from tests.core.transport.conftest import connection_to
from tests.factories import ClusterFactory, UserFactory, WorkerFactory
from tests.workers.metrics.scraping import value
from workers_app.liveness import Breakers, Liveness
from workers_app.models import AgentRelay, Reachability, RelayState, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = pytest.mark.django_db
TOKEN = "0123456789abcdef" * 3
REPO = Path(__file__).resolve().parents[3]


def staff_client() -> Client:
    client = Client()
    client.force_login(UserFactory(username="operator", is_staff=True))
    return client


def scrape_text(client: Client | None = None) -> str:
    response = (client or staff_client()).get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return response.content.decode()


def test_anonymous_visitors_and_ordinary_users_are_refused_staff_are_let_in() -> None:
    # Given nobody, a user, and an operator
    user = Client()
    user.force_login(UserFactory(username="alice"))
    # Then only the operator reads the metrics
    assert Client().get("/metrics").status_code == 403
    assert user.get("/metrics").status_code == 403
    assert "activate_workers" in scrape_text(staff_client())


def test_the_bearer_token_opens_it_only_when_the_operator_set_one_and_only_when_equal(
    settings: object,
) -> None:
    anonymous = Client()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    # Token access off: even the right-looking header, or an empty one, is refused
    assert anonymous.get("/metrics", headers=bearer).status_code == 403
    assert anonymous.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 403
    settings.ACTIVATE_METRICS_TOKEN = TOKEN  # type: ignore[attr-defined]
    # With it set: the token opens it; another one, or the token as another scheme, does not
    assert anonymous.get("/metrics", headers=bearer).status_code == 200
    wrong = {"Authorization": f"Bearer {TOKEN[:-1]}x"}
    assert anonymous.get("/metrics", headers=wrong).status_code == 403
    basic = {"Authorization": f"Basic {TOKEN}"}
    assert anonymous.get("/metrics", headers=basic).status_code == 403


def test_a_short_token_stops_start_up_naming_it(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
    environ.update(ACTIVATE_DATA_DIR=str(tmp_path), ACTIVATE_METRICS_TOKEN="secret")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ACTIVATE_METRICS_TOKEN must be" in result.stderr
    assert "Traceback" not in result.stderr


def test_live_workers_are_counted_by_cluster_and_status_with_zeros_and_finished_left_out() -> None:
    # Given two clusters, one offline, with workers in several statuses
    hpc = ClusterFactory(name="hpc", reachability=Reachability.ONLINE)
    lab = ClusterFactory(name="lab", reachability=Reachability.OFFLINE)
    for status in (S.CONNECTED, S.CONNECTED, S.QUEUED, S.STOPPED, S.ERROR):
        WorkerFactory(cluster=hpc, status=status)
    WorkerFactory(cluster=lab, status=S.PENDING)
    # When Prometheus scrapes
    text = scrape_text()
    # Then each live status of each cluster has its count, zero included
    assert value(text, "activate_workers", cluster="hpc", status="connected") == 2
    assert value(text, "activate_workers", cluster="hpc", status="queued") == 1
    assert value(text, "activate_workers", cluster="hpc", status="pending") == 0
    assert value(text, "activate_workers", cluster="lab", status="pending") == 1
    assert value(text, "activate_workers", cluster="lab", status="connected") == 0
    assert value(text, "activate_workers", cluster="hpc", status="stopped") is None
    # And each cluster's reachability is one of its states
    assert value(text, "activate_cluster_reachability", cluster="lab", state="offline") == 1
    assert value(text, "activate_cluster_reachability", cluster="lab", state="online") == 0
    assert value(text, "activate_cluster_reachability", cluster="hpc", state="online") == 1
    assert value(text, "activate_scrape_source_up", source="database") == 1


def test_the_scrape_reads_workers_in_one_query_however_many_clusters(
    django_assert_max_num_queries: object,
) -> None:
    for n in range(5):
        WorkerFactory(cluster=ClusterFactory(name=f"c{n}"), status=S.CONNECTED)
    # Clusters, workers, relays (database); cluster names for breakers (redis); sessions;
    # the operators' apps (each a kind of session, counted at zero too).
    with django_assert_max_num_queries(6):  # type: ignore[operator]
        scrape.ScrapeTime().collect()


def test_live_sessions_are_counted_by_kind_and_status() -> None:
    worker = WorkerFactory(status=S.CONNECTED)
    for kind, status in (("desktop", "running"), ("desktop", "running"), ("vscode", "pending")):
        Session.objects.create(
            name="s", owner=worker.owner, session_type=kind, worker=worker, status=status
        )
    Session.objects.create(
        name="s", owner=worker.owner, session_type="jupyter", worker=worker, status="ended"
    )
    text = scrape_text()
    assert value(text, "activate_sessions", kind="desktop", status="running") == 2
    assert value(text, "activate_sessions", kind="vscode", status="pending") == 1
    assert value(text, "activate_sessions", kind="jupyter", status="running") == 0
    assert value(text, "activate_sessions", kind="jupyter", status=SessionStatus.ENDED) is None


def test_sweep_lag_and_a_held_breaker_are_read_from_redis() -> None:
    # Given a heartbeat sweep that completed 42 s ago, and a cluster whose breaker holds
    cluster = ClusterFactory(name="hpc")
    sweep_lag.note_completed("heartbeats", at=time.time() - 42)
    Breakers().open(cluster.pk, silent=4, connected=5, at=time.time())
    text = scrape_text()
    lag = value(text, "activate_sweep_lag_seconds", kind="heartbeats")
    assert lag is not None and 42 <= lag < 50
    assert value(text, "activate_sweep_lag_seconds", kind="idle") is None  # never completed
    assert value(text, "activate_breaker_silent_workers", cluster="hpc") == 4
    assert value(text, "activate_sweep_interval_seconds") is not None


def test_a_relay_shows_its_state_and_repairs_and_unknown_once_no_keeper_confirms_it() -> None:
    now = timezone.now()
    AgentRelay.objects.create(
        cluster=ClusterFactory(name="far"), state=RelayState.UP, checked_at=now, repairs=3
    )
    AgentRelay.objects.create(
        cluster=ClusterFactory(name="lost"),
        state=RelayState.UP,
        checked_at=now - timedelta(days=1),
    )
    text = scrape_text()
    assert value(text, "activate_relay_state", cluster="far", state="up") == 1
    assert value(text, "activate_relay_state", cluster="far", state="down") == 0
    assert value(text, "activate_relay_repairs_total", cluster="far") == 3
    assert value(text, "activate_relay_state", cluster="lost", state="up") == 0
    assert value(text, "activate_relay_state", cluster="lost", state="unknown") == 1


def test_a_source_that_fails_is_marked_down_and_the_others_still_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def redis_is_down() -> list[object]:
        raise ConnectionError("Redis did not answer")

    WorkerFactory(cluster=ClusterFactory(name="hpc"), status=S.CONNECTED)
    monkeypatch.setitem(scrape._sources, "redis", redis_is_down)
    text = scrape_text()
    assert value(text, "activate_scrape_source_up", source="redis") == 0
    assert value(text, "activate_scrape_source_up", source="database") == 1
    assert value(text, "activate_workers", cluster="hpc", status="connected") == 1


def registry_value(name: str, **labels: str) -> float:
    """What this process recorded (no PROMETHEUS_MULTIPROC_DIR in tests)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def connect(client: Client, agent: SignedAgent, worker: Worker) -> int:
    body = {"worker": worker.public_id, "hostname": "node7"}
    return int(django_post(client, agent, "connect", body)[0])


def test_heartbeats_through_the_django_view_are_counted_accepted_and_refused() -> None:
    # Given a connected agent
    client = Client()
    worker, agent = worker_with_key()
    assert connect(client, agent, worker) == 200
    received = registry_value("activate_heartbeats_received_total")
    refused = registry_value("activate_heartbeats_refused_total", status="403")
    # When it beats twice, and a beat naming another worker's key is refused
    for _ in range(2):
        assert django_post(client, agent, "heartbeat", {"worker": worker.public_id})[0] == 200
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash="0" * 64)
    Liveness().forget(worker.pk, worker.public_id)
    assert django_post(client, agent, "heartbeat", {"worker": worker.public_id})[0] == 403
    # Then three were received and one refused, with its status
    assert registry_value("activate_heartbeats_received_total") == received + 3
    assert registry_value("activate_heartbeats_refused_total", status="403") == refused + 1


def test_a_connected_worker_observes_its_wait_from_request_to_connected(
    django_capture_on_commit_callbacks: object,
) -> None:
    worker, agent = worker_with_key()
    Worker.objects.filter(pk=worker.pk).update(created_at=timezone.now() - timedelta(seconds=90))
    labels = {"cluster": worker.cluster.name}
    count = registry_value("activate_request_to_connected_seconds_count", **labels)
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        assert connect(Client(), agent, worker) == 200
    assert registry_value("activate_request_to_connected_seconds_count", **labels) == count + 1
    waited = registry_value("activate_request_to_connected_seconds_sum", **labels)
    assert 90 <= waited < 100
    assert registry_value("activate_request_to_connected_seconds_bucket", le="60.0", **labels) == 0


GAUGE_THEN_EXIT = """
import os, sys
from prometheus_client import Counter, Gauge
Gauge("held", "h", multiprocess_mode="livesum").set(3)
Counter("done", "d").inc(5)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def test_an_ended_process_s_live_gauges_are_dropped_and_its_counters_kept(tmp_path: Path) -> None:
    # Given two processes writing to one metrics directory, one of which ends
    environ = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", GAUGE_THEN_EXIT],
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    pids = [int(p.stdout.readline()) for p in processes]  # type: ignore[union-attr]
    ended, alive = processes
    ended.communicate("", timeout=30)

    def exposed() -> str:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        return generate_latest(registry).decode()

    assert value(exposed(), "held") == 6
    # When the scrape looks for ended processes
    assert views.forget_dead_processes(str(tmp_path)) == [pids[0]]
    # Then the ended one's gauge is gone, the live one's stays, and both counters stay
    text = exposed()
    assert value(text, "held") == 3
    assert value(text, "done_total") == 10
    alive.communicate("", timeout=30)


def test_a_process_that_drops_its_connections_to_a_cluster_reports_zero_for_it() -> None:
    families.ssh_connections_held({"hpc": 2, "lab": 1})
    assert registry_value("activate_ssh_connections", cluster="hpc") == 2
    families.ssh_connections_held({"lab": 1})
    assert registry_value("activate_ssh_connections", cluster="hpc") == 0
    assert registry_value("activate_ssh_connections", cluster="lab") == 1
    families.ssh_connections_held({})


@pytest.mark.slurm
def test_a_command_that_finds_every_channel_taken_reports_how_long_it_waited(
    ssh_target: SshTarget,
) -> None:
    # Given a connection of one channel, over real SSH
    waits: list[float] = []
    connection = connection_to(ssh_target, max_channels=1, on_channel_wait=waits.append)
    try:
        connection.run(["true"])
        assert waits == []  # a free channel is no wait
        # When two commands of a second each go at once
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: connection.run(["sleep", "1"]), range(2)))
    finally:
        connection.close()
    # Then the second waited about the first's second, and said so once
    assert [r.exit_status for r in results] == [0, 0]
    assert len(waits) == 1 and 0.7 < waits[0] < 5, waits


def test_the_dashboard_and_the_readme_name_only_metrics_the_platform_has() -> None:
    # Given every family this process defines and every one read at scrape time
    WorkerFactory(status=S.CONNECTED)
    known = {metric.name for metric in REGISTRY.collect()}
    known |= {metric.name for metric in scrape.ScrapeTime().collect()}
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    readme = (REPO / "README.md").read_text()
    operations = readme[readme.index("## Operations: metrics and alerts") :]
    operations = operations[: operations.index("\n## ", 10)]
    # Then each name the dashboard's queries and the README's section use is one of them
    for text in [*queries, operations]:
        for name in re.findall(r"\bactivate_[a-z_]+", text):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert base in known, (name, text[:200])
    assert len(queries) >= 20


def test_start_sh_gives_every_process_the_data_directory_s_metrics_and_make_run_empties_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a data directory with an earlier run's metrics in it
    metrics = tmp_path / "metrics"
    environ = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    environ["ACTIVATE_DATA_DIR"] = str(tmp_path)
    # start.sh (whatever the role; none here) makes the directory, private, and leaves it be
    subprocess.run(["bash", "scripts/start.sh"], cwd=REPO, env=environ, capture_output=True)
    assert metrics.is_dir() and (metrics.stat().st_mode & 0o777) == 0o700
    (metrics / "counter_123.db").write_bytes(b"old")
    subprocess.run(["bash", "scripts/start.sh"], cwd=REPO, env=environ, capture_output=True)
    assert (metrics / "counter_123.db").exists()
    # When make run starts its processes
    monkeypatch.setenv("ACTIVATE_DATA_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location("make_run", REPO / "scripts" / "run.py")
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    given = run.fresh_metrics_directory({})
    # Then they are told the same directory, emptied
    assert given["PROMETHEUS_MULTIPROC_DIR"] == str(metrics)
    assert list(metrics.iterdir()) == []

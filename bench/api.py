"""API: GET /api/workers/ with 10,000 workers in PostgreSQL.

SQL queries per request are counted in-process (CaptureQueriesContext around the Django test
client); latency is timed over HTTP against the deployed web server. Side by side: a list that
asks the scheduler on every view, as portals without a database do (one `ssh host squeue`).
"""

from __future__ import annotations

import random
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from bench.report import Goal, Outcome, Table, millis, percentile, times
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import CLUSTER_NAME, HELD_ENVIRONMENT, forget_workers, run_user, start_afresh
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform

NAME = "api"
MIX = (
    ("connected", 40),
    ("queued", 20),
    ("pending", 10),
    ("stopping", 5),
    ("stopped", 20),
    ("error", 5),
)


@dataclass
class Measured:
    label: str
    path: str
    rows: int
    queries: int
    in_process: float
    http: list[float]


def _fill(count: int, first: int = 0) -> None:
    from django.db import connection
    from django.utils import timezone

    from workers_app.models import Cluster, Environment, Worker

    owner = run_user("bench-api")
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    environment = Environment.objects.get(cluster=cluster, name=HELD_ENVIRONMENT)
    statuses = [status for status, share in MIX for _ in range(share)]
    chooser = random.Random(7)
    now = timezone.now()
    batch = []
    for i in range(first, first + count):
        status = chooser.choice(statuses)
        finished = status in {"stopped", "error"}
        batch.append(
            Worker(
                name=f"bench-api-{i}",
                owner=owner,
                cluster=cluster,
                environment=environment,
                params={"walltime": "01:00:00"},
                status=status,
                scheduler_job_id="" if status == "pending" else str(7_000_000 + i),
                node_hostname="node01" if status == "connected" else "",
                created_at=now - timedelta(seconds=first + count - i),
                finished_at=now - timedelta(seconds=chooser.randint(1, 600)) if finished else None,
            )
        )
        if len(batch) == 1000:
            Worker.objects.bulk_create(batch)
            batch = []
    Worker.objects.bulk_create(batch)
    # What autovacuum does to a table that grew this much: the planner's row counts are then
    # true (stale ones have it sort every worker for a page of 100).
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Worker._meta.db_table}")


def _in_process(key: str, path: str, repeat: int) -> tuple[int, int, float]:
    """Rows returned, SQL queries, median time of the whole Django request."""
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {key}")
    client.get(path)  # the key's last_used_at is written once; count the steady state
    # Django empties the query log when a request starts: the capture must start from empty.
    reset_queries()
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    # Read now: later requests empty the connection's query log.
    queries = len(captured.captured_queries)
    if response.status_code != 200:
        raise HarnessError(f"GET {path} answered {response.status_code}")
    rows = len(response.json()["results"])
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(path)
        durations.append(time.perf_counter() - started)
    return rows, queries, statistics.median(durations)


def _over_http(platform: Platform, key: str, path: str, repeat: int) -> list[float]:
    durations = []
    with platform.api(key) as client:
        for _ in range(5):
            client.get(path)
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(path)
            durations.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise HarnessError(f"GET {path} answered {response.status_code}")
    return durations


def _scheduler_per_view(target: SshTarget, repeat: int) -> list[float]:
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = subprocess.run(
            target.ssh_argv("squeue", "-u", target.user),
            capture_output=True,
            timeout=60,
            check=False,
        )
        durations.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise HarnessError("ssh squeue failed")
    return durations


def run(
    target: SshTarget, *, workers: int = 10_000, requests: int = 200, ssh_samples: int = 20
) -> Outcome:
    from workers_app.models import ApiKey

    start_afresh(target)
    owner = run_user("bench-api")
    _, key = ApiKey.issue(owner, name="bench-api")
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-"))
    platform = Platform(workdir=workdir, knobs={**PRODUCTION_KNOBS, **NO_RECONCILE})
    measured: list[Measured] = []
    try:
        started = time.perf_counter()
        _fill(workers)
        fill_time = time.perf_counter() - started
        platform.start_deployed_web(workers=2, threads=4)
        pages = (
            ("first page (default limit 100)", "/api/workers/", requests),
            ("one status (?status=connected)", "/api/workers/?status=connected", requests),
            ("page of 1,000 (?limit=1000)", "/api/workers/?limit=1000", max(requests // 4, 10)),
            (
                f"last page (?offset={workers - 100})",
                f"/api/workers/?offset={workers - 100}",
                requests,
            ),
        )
        for label, path, repeat in pages:
            rows, queries, in_process = _in_process(key, path, max(repeat // 4, 5))
            http = _over_http(platform, key, path, repeat)
            measured.append(Measured(label, path, rows, queries, in_process, http))
            print(f"  api {path}: p50 {statistics.median(http) * 1000:.1f} ms", flush=True)
        ssh = _scheduler_per_view(target, ssh_samples)
    finally:
        platform.stop_all()
        forget_workers()
        ApiKey.objects.filter(user=owner).delete()
    return _outcome(measured, ssh, workers, fill_time)


def _outcome(measured: list[Measured], ssh: list[float], workers: int, fill: float) -> Outcome:
    table = Table(
        f"API: GET /api/workers/ with {workers:,} workers in PostgreSQL (one non-staff owner)",
        ["request", "rows", "SQL queries", "in-process p50", "HTTP p50", "HTTP p95", "requests"],
        align="lrrrrrr",
    )
    for m in measured:
        table.add(
            f"{m.label}",
            m.rows,
            m.queries,
            millis(m.in_process),
            millis(percentile(m.http, 50)),
            millis(percentile(m.http, 95)),
            len(m.http),
        )
    first = measured[0]
    table.add(
        "reference: list asked of the scheduler per view (`ssh host squeue -u USER`)",
        "-",
        "-",
        "-",
        millis(percentile(ssh, 50)),
        millis(percentile(ssh, 95)),
        len(ssh),
    )
    table.notes += [
        "in-process: django.test.Client with CaptureQueriesContext (queries include API-key "
        "authentication); HTTP: httpx keep-alive, one request at a time, after 5 warm-up "
        "requests, against scripts/start.sh web (2 workers x 4 threads, production settings).",
        f"workers made with bulk_create in {fill:.1f} s; statuses mixed "
        + ", ".join(f"{status} {share}%" for status, share in MIX)
        + "; finished ones within the purge window so they are listed.",
        f"first page vs. the per-view scheduler query: "
        f"{times(percentile(ssh, 50) / percentile(first.http, 50))} faster at p50 "
        "(the scheduler query also returns nothing of the platform's own state).",
    ]
    most_rows = max(measured, key=lambda m: m.rows)
    goals = [
        Goal(
            NAME,
            "SQL queries per list request do not grow with the rows returned",
            ", ".join(f"{m.rows} rows: {m.queries}" for m in (first, most_rows)),
            most_rows.queries <= first.queries,
        ),
        Goal(
            NAME,
            f"first page p95 < 100 ms over HTTP with {workers:,} workers (no regression)",
            millis(percentile(first.http, 95)),
            percentile(first.http, 95) < 0.100,
        ),
    ]
    return Outcome([table], goals)

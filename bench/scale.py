"""Ten thousand workers: the heartbeat sweep over 1,000 and 10,000 connected workers, one poll
cycle over 1,000 and 10,000 held jobs of one account on the real Slurm, the API's first page with
10,000 and 100,000 workers in PostgreSQL, and the staff Workers page over 1,000 and 10,000 rows.
Each with its time and memory, side by side, so the growth from one size to the next shows.

The sweep and the poll run in-process (tracemalloc's peak is their memory); the API and the page
are timed over HTTP against `scripts/start.sh web` with production settings (the memory is the
web processes' resident set after the requests).
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

from bench import api
from bench.polling import _poll_cycles
from bench.report import Goal, Outcome, Table, millis, percentile, rss, seconds
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import forget_workers, run_id, run_user, start_afresh
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform

NAME = "scale"
PASSWORD = secrets.token_urlsafe(16)


@dataclass
class Figure:
    what: str
    size: int
    took: float  # the median, or p50 over HTTP
    p95: float
    memory: int  # bytes
    note: str = ""


def _timed_call(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _peak(action: Callable[[], object]) -> int:
    """tracemalloc's peak bytes over one call (timed apart: tracing slows Python down)."""
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _connected(cluster_id: int, count: int, tag: str) -> list[int]:
    from django.utils import timezone

    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    owner = run_user("bench-scale")
    now = timezone.now()
    rows = [
        Worker(
            name=f"{tag}-{i}",
            owner=owner,
            cluster_id=cluster_id,
            status=WorkerStatus.CONNECTED,
            scheduler_job_id=str(8_000_000 + i),
            node_hostname="node01",
            created_at=now - timedelta(seconds=count - i),
            connected_at=now,
        )
        for i in range(count)
    ]
    Worker.objects.bulk_create(rows, batch_size=2000)
    return list(
        Worker.objects.filter(name__startswith=f"{tag}-")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _sweep(cluster_id: int, count: int, cycles: int) -> tuple[Figure, Figure]:
    """A sweep that stops the 1% of workers gone silent, then the steady sweeps (none)."""
    from django.test import override_settings

    from workers_app.liveness import Liveness, SweepRecord
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus
    from workers_app.sweeps import sweep_heartbeats

    ids = _connected(cluster_id, count, f"bench-scale-sweep-{run_id()}")
    silent = set(ids[::100])
    store = Liveness()
    store.claim_reset()  # the store is this run's: intact from here on
    store.beat_many([pk for pk in ids if pk not in silent])
    stopped: list[int] = []

    def sweep() -> None:
        SweepRecord().note_sweep(time.time())
        stopped.append(sweep_heartbeats(store=store))

    try:
        # Hearing is the agents' server's to answer; none runs here, and it is not what grows.
        with override_settings(ACTIVATE_HEARING_PROBE=False):
            took = _timed_call(sweep)
            # The same silence again, for the memory it takes.
            Worker.objects.filter(pk__in=silent).update(status=WorkerStatus.CONNECTED)
            memory = _peak(sweep)
            if stopped != [len(silent)] * 2:
                raise HarnessError(f"the sweeps stopped {stopped}, not the {len(silent)} silent")
            del stopped[:]
            steady = []
            for _ in range(cycles):
                store.beat_many([pk for pk in ids if pk not in silent])
                steady.append(_timed_call(sweep))
            steady_memory = _peak(sweep)
        if any(stopped):
            raise HarnessError(f"steady sweeps stopped workers: {stopped}")
        left = Worker.objects.filter(pk__in=ids, status=WorkerStatus.CONNECTED).count()
        if left != count - len(silent):
            raise HarnessError(f"{left} of {count} still connected after the sweeps")
    finally:
        Worker.objects.filter(pk__in=ids).delete()
        for pk in ids:
            store.forget(pk)
    return (
        Figure("heartbeat sweep, 1% silent (stopped)", count, took, took, memory),
        Figure(
            "heartbeat sweep, none silent",
            count,
            statistics.median(steady),
            max(steady),
            steady_memory,
            f"median of {cycles}",
        ),
    )


def _poll(target: SshTarget, cluster_id: int, count: int, held: list[str], tag: str) -> Figure:
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    names = [f"{tag}-{i}" for i in range(len(held), count)]
    made = target.sbatch_held(names)
    held += made
    owner = run_user("bench-scale")
    Worker.objects.bulk_create(
        (
            Worker(
                name=name,
                owner=owner,
                cluster_id=cluster_id,
                status=WorkerStatus.QUEUED,
                scheduler_job_id=job_id,
            )
            for name, job_id in zip(names, made, strict=True)
        ),
        batch_size=2000,
    )
    cycles = [_poll_cycles(cluster_id, count, 5, accounts=1)]
    memory = _peak(lambda: cycles.append(_poll_cycles(cluster_id, count, 1, accounts=1)))
    return Figure(
        "poll cycle, held Slurm jobs of one account",
        count,
        cycles[0].cycle,
        cycles[0].first_cycle,
        memory,
        f"{cycles[0].commands} command(s); p95 column: the first cycle (+connect)",
    )


def _logged_in(platform: Platform, username: str) -> httpx.Client:
    client = httpx.Client(base_url=platform.url, timeout=60)
    client.get("/login/")
    token = client.cookies.get("csrftoken", "")
    answer = client.post(
        "/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": platform.url + "/login/"},
    )
    if answer.status_code not in (200, 302) or "sessionid" not in client.cookies:
        raise HarnessError(f"login as {username} answered {answer.status_code}")
    return client


def _timed(client: httpx.Client, path: str, repeat: int, needle: str = "") -> list[float]:
    durations = []
    for n in range(repeat + 5):
        started = time.perf_counter()
        answer = client.get(path)
        took = time.perf_counter() - started
        if answer.status_code != 200 or needle not in answer.text:
            raise HarnessError(f"GET {path} answered {answer.status_code}")
        if n >= 5:
            durations.append(took)
    return durations


def _served(target: SshTarget, sizes: tuple[int, ...], requests: int) -> list[Figure]:
    """The API's first page (as its owner) and the Workers page (as staff, everyone's)."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher
    from django.contrib.auth.models import User

    from workers_app.models import ApiKey

    figures: list[Figure] = []
    owner = run_user("bench-api")
    staff, _ = User.objects.get_or_create(username="bench-scale-staff")
    staff.is_staff = True
    # Hashed as the production server's settings verify it (the run's own settings hash faster).
    hasher = PBKDF2PasswordHasher()
    staff.password = hasher.encode(PASSWORD, hasher.salt())
    staff.save()
    _, key = ApiKey.issue(owner, name="bench-scale")
    start_afresh(target)
    made = 0
    for size in sorted(sizes):
        api._fill(size - made, first=made)  # the API benchmark's own mix of statuses
        made = size
        platform = Platform(
            workdir=Path(tempfile.mkdtemp(prefix="bench-scale-")),
            # Plain HTTP here (TLS ends at a proxy in production): cookies without "Secure".
            knobs={**PRODUCTION_KNOBS, **NO_RECONCILE, "ACTIVATE_SECURE_COOKIES": "false"},
        )
        try:
            platform.start_deployed_web(workers=2, threads=4)
            with platform.api(key) as client:
                first = _timed(client, "/api/workers/", requests)
            figures.append(
                Figure(
                    "API first page (GET /api/workers/, its owner)",
                    size,
                    percentile(first, 50),
                    percentile(first, 95),
                    rss(platform.child_pids("web")),
                    f"{len(first)} requests",
                )
            )
            client = _logged_in(platform, staff.username)
            try:
                page = _timed(client, "/workers/", max(requests // 4, 20), needle="bench-api-")
                table = _timed(client, "/workers/table/", max(requests // 4, 20))
            finally:
                client.close()
            for what, durations in (
                ("Workers page for staff (GET /workers/, 50 rows of all)", page),
                ("its two-second refresh (GET /workers/table/)", table),
            ):
                figures.append(
                    Figure(
                        what,
                        size,
                        percentile(durations, 50),
                        percentile(durations, 95),
                        rss(platform.child_pids("web")),
                        f"{len(durations)} requests",
                    )
                )
        finally:
            platform.stop_all()
        print(f"  scale: served {size:,} workers", flush=True)
    forget_workers()
    ApiKey.objects.filter(user=owner).delete()
    return figures


def run(
    target: SshTarget,
    *,
    sweep_sizes: tuple[int, ...] = (1_000, 10_000),
    poll_sizes: tuple[int, ...] = (1_000, 10_000),
    served_sizes: tuple[int, ...] = (10_000, 100_000),
    requests: int = 200,
    cycles: int = 5,
) -> Outcome:
    from workers_app.models import Worker

    cluster = start_afresh(target)
    figures: list[Figure] = []
    for size in sweep_sizes:
        figures += _sweep(cluster.pk, size, cycles)
        print(f"  scale: swept {size:,} connected workers", flush=True)
    held: list[str] = []
    tag = f"bench-scale-poll-{run_id()}"
    try:
        for size in sorted(poll_sizes):
            figures.append(_poll(target, cluster.pk, size, held, tag))
            print(f"  scale: polled {size:,} held jobs", flush=True)
    finally:
        target.cancel_ids(held)
        Worker.objects.filter(cluster=cluster).delete()
    figures += _served(target, served_sizes, requests)
    return _outcome(figures)


def _outcome(figures: list[Figure]) -> Outcome:
    table = Table(
        "Ten thousand workers: each measure at two sizes, side by side",
        ["measure", "size", "p50 / median", "p95 / max", "memory", "growth of p50", "notes"],
        align="lrrrrrl",
    )
    smallest: dict[str, Figure] = {}
    for figure in figures:
        base = smallest.setdefault(figure.what, figure)
        growth = (
            "-"
            if base is figure
            else f"{figure.took / base.took:.1f}x for {figure.size / base.size:.0f}x the size"
        )
        table.add(
            figure.what,
            f"{figure.size:,}",
            seconds(figure.took),
            seconds(figure.p95),
            f"{figure.memory / 2**20:.1f} MiB",
            growth,
            figure.note,
        )
    table.notes += [
        "heartbeat sweep: workers_app.sweeps.sweep_heartbeats in-process against the run's "
        "Redis and PostgreSQL, connected worker rows with one key each (beat_many); 1 in 100 "
        "without a key is stopped by the first sweep (its mark_disconnected rows included); "
        "memory: tracemalloc's peak of one more sweep like it, traced apart from the timed ones. "
        "The hearing probe is off: it asks the agents' "
        "server once per sweep, whatever the number of workers.",
        "poll cycle: workers_app.actions.jobs.poll_cluster (bench/polling.py's cycle), held jobs "
        "(`sbatch --hold`) of the cluster account; memory: tracemalloc's peak over a first "
        "cycle and one more, traced apart from the timed ones.",
        "API and page: scripts/start.sh web (2 processes x 4 threads, production settings), "
        "httpx keep-alive, one request at a time after 5 warm-up requests; memory: the web "
        "processes' resident set after the requests. Workers of bench/api.py's mix of "
        "statuses, one owner; the staff user sees all of them, 50 to a page.",
    ]
    by = {(f.what, f.size): f for f in figures}
    goals: list[Goal] = []

    def goal(what: str, size: int, bound: float, text: str, *, p95: bool = False) -> None:
        figure = by.get((what, size))
        if figure is None:
            return
        value = figure.p95 if p95 else figure.took
        goals.append(Goal(NAME, text, millis(value), value < bound))

    goal(
        "poll cycle, held Slurm jobs of one account", 10_000, 1.0, "poll cycle at 10,000 jobs < 1 s"
    )
    goal("heartbeat sweep, none silent", 10_000, 1.0, "sweep over 10,000 connected < 1 s")
    goal(
        "heartbeat sweep, 1% silent (stopped)",
        10_000,
        1.0,
        "sweep over 10,000 connected, 100 stopped, < 1 s",
    )
    goal(
        "API first page (GET /api/workers/, its owner)",
        100_000,
        0.100,
        "API first page p95 < 100 ms at 100,000 workers",
        p95=True,
    )
    return Outcome([table], goals)

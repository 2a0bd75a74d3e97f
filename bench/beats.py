"""Beats at scale: 1,000 and 10,000 connected agents beating the agents' server at their steady
rate (one beat each per ACTIVATE_HEARTBEAT_INTERVAL, 30 s) and at ten times it (a burst), open
loop: every beat has a scheduled time and its latency is counted from that time, so a server
that falls behind is charged for the beats queued behind it (no coordinated omission).

- The server: `scripts/start.sh agents` with production settings, as the heartbeats section
  starts it (bench/heartbeats.py).
- The agents: worker rows made in bulk as a submission leaves them (queued, a job id, the hash of
  a key of their own), then each connected through POST /agent/v1/connect, signed with its key,
  as its agent would. Each one's "last seen" marker is then given a random part of its minute,
  as a server that has heard these agents for a while has them: the first beat of each worker in
  a minute writes last_heartbeat_at, at the steady rate of one worker in sixty a second.
- The load: each agent beats at its own random phase within the interval; the beats are signed
  beforehand, each with its agent's key, a nonce of its own and its scheduled time as the
  timestamp (as the agent stamps it when it sends), then sent by a few processes of
  bench/beat_load.py (uvloop), each beat on a new connection closed after the answer, as the
  agent's urllib does.
- The generator is shown not to be the bottleneck by its own CPU, by how late it sent beats, and
  by the same burst against a plain ASGI callable doing one Redis SET (bench/bare_asgi.py).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

from bench.heartbeats import BEAT_PATH, _group_cpu, _start_bare, _start_ours, _stop
from bench.report import Goal, Outcome, Table, millis, percentile, rate, rss
from harness import REPO, HarnessError
from harness.agents import SignedAgent
from harness.cluster import SshTarget
from harness.objects import forget_workers, run_user, start_afresh
from harness.platform import BIN, NO_RECONCILE, PRODUCTION_KNOBS, Platform, free_port

NAME = "beats"
INTERVAL = 30.0  # ACTIVATE_HEARTBEAT_INTERVAL as shipped
BURST = 10
GOAL_P99 = 0.100
FAKE_JOB_IDS = 9_000_000
OURS = "agents' server"
BARE = "plain ASGI callable, one Redis SET (reference)"
# Seconds between writing the plan and its first beat, beyond the time signing is expected to
# take: the generators start, read their plans and wait.
LEAD = 2.5
SEEN_WINDOW = 60  # agents.service.LAST_SEEN_GRANULARITY


@dataclass
class Phase:
    server: str
    agents: int
    name: str
    target: float  # beats a second asked for
    duration: float
    beats: int
    answered_ok: int
    failures: dict[str, int]
    span: float  # from the first beat's scheduled time to the last answer
    p50: float
    p99: float
    worst: float
    lag_p99: float  # how late the generators sent (scheduled to connect started)
    open_at_most: int
    server_cpu: float
    generator_cpu: float
    server_rss: int  # peak resident set of the server's processes
    seen_writes: int  # last_heartbeat_at updates PostgreSQL counted during the phase

    @property
    def achieved(self) -> float:
        return self.answered_ok / self.span if self.span else float("nan")


@dataclass(frozen=True)
class Agent:
    signed: SignedAgent
    worker_id: int
    job_id: str


def _workers(count: int, first: int, secret_key: str) -> list[Agent]:
    """``count`` workers as a poll leaves them once the scheduler shows their jobs on a node
    (starting, with a job, a node and a key of their own, and the events saying so), made in
    bulk; their keys come back as their agents hold them."""
    from django.conf import settings
    from django.utils import timezone

    from harness.objects import CLUSTER_NAME
    from workers_app.agent_keys import issue_agent_key
    from workers_app.models import Cluster, Worker, WorkerEvent
    from workers_app.statuses import WorkerStatus

    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    owner = run_user("bench-beats")
    now = timezone.now()
    deadline = now + timedelta(seconds=settings.ACTIVATE_PENDING_TIMEOUT)
    rows, keys = [], []
    for i in range(first, first + count):
        worker = Worker(
            name=f"bench-beats-{i}",
            owner=owner,
            cluster=cluster,
            status=WorkerStatus.STARTING,
            scheduler_job_id=str(FAKE_JOB_IDS + i),
            node_hostname="bench-node",
            created_at=now,
            submitted_at=now,
            started_at=now,
            deadline_at=deadline,
        )
        key = issue_agent_key(worker.public_id, secret_key=secret_key)
        worker.agent_secret_hash = key.key_hash
        rows.append(worker)
        keys.append(key)
    Worker.objects.bulk_create(rows, batch_size=2000)
    pks = dict(
        Worker.objects.filter(name__startswith="bench-beats-").values_list("public_id", "pk")
    )
    steps = (
        (WorkerStatus.PENDING, WorkerStatus.QUEUED),
        (WorkerStatus.QUEUED, WorkerStatus.STARTING),
    )
    WorkerEvent.objects.bulk_create(
        (
            WorkerEvent(worker_id=pks[w.public_id], old_status=old, new_status=new, at=now)
            for w in rows
            for old, new in steps
        ),
        batch_size=4000,
    )
    return [
        Agent(SignedAgent(w.public_id, key.key_id, key.key), pks[w.public_id], w.scheduler_job_id)
        for w, key in zip(rows, keys, strict=True)
    ]


def _connect(agents: list[Agent], url: str, *, threads: int = 8) -> float:
    """Every agent connects through the real endpoint, a few at a time: the seconds it took."""
    local = threading.local()

    def connect(agent: Agent) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, timeout=60)
        worker = agent.signed.public_id
        payload: dict[str, object] = {
            "worker": worker,
            "hostname": "bench-node",
            "job_id": agent.job_id,
        }
        answer = agent.signed.post(client, "/agent/v1/connect", payload)
        if answer.status_code != 200 or not answer.signed:
            raise HarnessError(
                f"connect answered {answer.status_code}: {answer.response.text[:200]}"
            )

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(connect, agents))
    return time.perf_counter() - started


def _stagger_seen(agents: list[Agent], rng: random.Random) -> None:
    """Each worker's "last seen" marker with a random part of its minute left, as a server that
    has heard these agents for a while has them (the connect sets none)."""
    from agents.beats import SEEN_PREFIX
    from core.redis_connection import redis_client

    pipe = redis_client().pipeline(transaction=False)
    for agent in agents:
        pipe.set(f"{SEEN_PREFIX}{agent.worker_id}", 1, ex=rng.randint(1, SEEN_WINDOW))
    pipe.execute()


def _schedule(
    agents: list[Agent], per_second: float, duration: float, rng: random.Random
) -> list[tuple[float, Agent]]:
    """Each agent's beats at its own random phase, one every len(agents) / per_second seconds,
    over ``duration`` seconds: (offset, agent), in time order."""
    interval = len(agents) / per_second
    beats = []
    for agent in agents:
        offset = rng.uniform(0, interval)
        while offset < duration:
            beats.append((offset, agent))
            offset += interval
    beats.sort(key=lambda beat: beat[0])
    return beats


def _write_plans(
    beats: list[tuple[float, Agent]], url: str, workdir: Path, processes: int
) -> list[Path]:
    """The beats signed (the scheduled time as each one's timestamp), split over ``processes``
    plans by agent (one agent's beats stay in order in one process)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.time()
    # Signing takes time, and the timestamps must be known before: measure, then allow for it.
    sample = beats[: min(len(beats), 500)]
    for _, agent in sample:
        agent.signed.signed(BEAT_PATH, b"{}", ts="1.000000")
    per_beat = (time.time() - started) / max(len(sample), 1)
    start = time.time() + LEAD + 2 * per_beat * len(beats)
    base = int(start * 1_000_000)
    lines: list[list[str]] = [[] for _ in range(processes)]
    for offset, agent in beats:
        body = f'{{"worker": "{agent.signed.public_id}"}}'
        seconds, micros = divmod(base + int(offset * 1_000_000), 1_000_000)
        header, _ = agent.signed.signed(BEAT_PATH, body.encode(), ts=f"{seconds}.{micros:06d}")
        lines[agent.worker_id % processes].append(f"{offset:.6f}\t{header}\t{body}\n")
    head = json.dumps({"host": host, "port": int(port), "start": start}) + "\n"
    plans = []
    for number, chunk in enumerate(lines):
        plan = workdir / f"plan-{number}.txt"
        plan.write_text(head + "".join(chunk))
        plans.append(plan)
    return plans


def _group_pids(leader: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getpgid(int(proc.name)) == leader:
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


class PeakRss:
    """The largest resident set of a process group, sampled four times a second meanwhile."""

    def __init__(self, leader: int) -> None:
        self.pids = _group_pids(leader)
        self.peak = rss(self.pids)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopping.wait(0.25):
            self.peak = max(self.peak, rss(self.pids))

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join()


def _worker_updates() -> int:
    """Rows of the worker table PostgreSQL has counted as updated so far."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = %s",
            ["workers_app_worker"],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _phase(
    server: str,
    leader: int,
    url: str,
    agents: list[Agent],
    workdir: Path,
    *,
    name: str,
    per_second: float,
    duration: float,
    processes: int,
    rng: random.Random,
) -> Phase:
    beats = _schedule(agents, per_second, duration, rng)
    plans = _write_plans(beats, url, workdir, processes)
    outs = [plan.with_suffix(".out") for plan in plans]
    updates_before = _worker_updates()
    with PeakRss(leader) as rss:
        cpu_before = _group_cpu(leader)
        generators = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.beat_load", str(plan), str(out)], cwd=REPO
            )
            for plan, out in zip(plans, outs, strict=True)
        ]
        codes = [g.wait(timeout=duration + 120) for g in generators]
        server_cpu = _group_cpu(leader) - cpu_before
    time.sleep(1.5)  # the last writes' statistics reach pg_stat_user_tables
    seen_writes = _worker_updates() - updates_before
    results = [json.loads(out.read_text()) for out in outs]
    for plan, out in zip(plans, outs, strict=True):
        plan.unlink()
        out.unlink()
    for code, result in zip(codes, results, strict=True):
        if code != 0 or "error" in result:
            raise HarnessError(f"beat generator failed: {result.get('error', code)}")
    latencies = [value for result in results for value in result["latencies"]]
    lags = [value for result in results for value in result["lags"]]
    failures: dict[str, int] = {}
    answered_ok = 0
    for result in results:
        for status, count in result["statuses"].items():
            if status.startswith("2"):
                answered_ok += count
            else:
                failures[status] = failures.get(status, 0) + count
    span = max(result["span"] for result in results)
    measured = Phase(
        server=server,
        agents=len(agents),
        name=name,
        target=per_second,
        duration=duration,
        beats=len(beats),
        answered_ok=answered_ok,
        failures=failures,
        span=span,
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        worst=max(latencies, default=float("nan")),
        lag_p99=percentile(lags, 99),
        open_at_most=sum(result["open_at_most"] for result in results),
        server_cpu=server_cpu,
        generator_cpu=sum(result["cpu"] for result in results),
        server_rss=rss.peak,
        seen_writes=seen_writes,
    )
    if len(latencies) != len(beats):
        raise HarnessError(f"{len(beats)} beats planned, {len(latencies)} timed")
    print(
        f"  beats: {server}, {len(agents):,} agents, {name}: {rate(measured.achieved)} of "
        f"{rate(per_second)}, p50 {millis(measured.p50)}, p99 {millis(measured.p99)}, "
        f"max {millis(measured.worst)}, failed {sum(failures.values())}",
        flush=True,
    )
    return measured


def _redis_memory() -> tuple[int, int]:
    """Keys in the run's Redis database and the bytes they take (MEMORY USAGE, all of them)."""
    from core.redis_connection import redis_client

    client = redis_client()
    keys = list(client.scan_iter(count=5000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return len(keys), sum(value or 0 for value in pipe.execute())


@dataclass
class Size:
    agents: int
    connect_seconds: float
    redis_keys: int
    redis_bytes: int


def run(
    target: SshTarget,
    *,
    sizes: tuple[int, ...] = (1_000, 10_000),
    steady_duration: float = 30,
    burst_duration: float = 25,
    processes: int = 2,
    server_workers: int = 2,
    seed: int = 24,
) -> Outcome:
    start_afresh(target)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-beats-"))
    platform = Platform(workdir=workdir, knobs={**PRODUCTION_KNOBS, **NO_RECONCILE})
    phases: list[Phase] = []
    sizes_measured: list[Size] = []
    bare = None
    try:
        secret_key = secrets.token_urlsafe(40)
        ours = _start_ours(platform, server_workers, secret_key)
        agents: list[Agent] = []
        for size in sorted(sizes):
            made = _workers(size - len(agents), len(agents), secret_key)
            took = _connect(made, platform.agent_url)
            agents += made
            print(f"  beats: {size:,} agents connected ({len(made):,} in {took:.0f} s)", flush=True)
            _stagger_seen(agents, rng)
            steady = size / INTERVAL
            for name, per_second, duration in (
                ("steady (1 per 30 s each)", steady, steady_duration),
                (f"burst ({BURST}x)", BURST * steady, burst_duration),
            ):
                phases.append(
                    _phase(
                        OURS, ours.pid, platform.agent_url, agents, workdir, name=name,
                        per_second=per_second, duration=duration, processes=processes, rng=rng,
                    )
                )  # fmt: skip
            keys, used = _redis_memory()
            sizes_measured.append(Size(size, took, keys, used))
        # The same burst against a server that checks nothing: what the generator and the
        # machine allow, whatever the agents' server does.
        bare_url = f"http://127.0.0.1:{free_port()}"
        host, port = bare_url.removeprefix("http://").split(":")
        argv = [str(BIN / "uvicorn"), "bench.bare_asgi:application", "--host", host]
        argv += ["--port", port, "--workers", str(server_workers), "--loop", "uvloop"]
        argv += ["--http", "httptools", "--no-access-log"]
        bare = _start_bare(argv, workdir / "bare-asgi.log", bare_url)
        phases.append(
            _phase(
                BARE, bare.pid, bare_url, agents, workdir, name=f"burst ({BURST}x)",
                per_second=BURST * len(agents) / INTERVAL, duration=burst_duration,
                processes=processes, rng=rng,
            )
        )  # fmt: skip
    finally:
        if bare is not None:
            _stop(bare)
        platform.stop_all()
        forget_workers()
    return _outcome(phases, sizes_measured, server_workers, processes)


def _failed(phase: Phase) -> str:
    if not phase.failures:
        return "0"
    return ", ".join(f"{count} {status}" for status, count in sorted(phase.failures.items()))


def _outcome(
    phases: list[Phase], sizes: list[Size], server_workers: int, processes: int
) -> Outcome:
    table = Table(
        "Beats: connected agents beating open loop, latency from each beat's scheduled time",
        ["server", "agents", "load", "asked", "answered", "p50", "p99", "max", "failed",
         "server CPU", "generator CPU", "server RSS (peak)", "last-seen writes"],
        align="lrlrrrrrrrrrr",
    )  # fmt: skip
    for p in phases:
        table.add(
            p.server,
            f"{p.agents:,}",
            p.name,
            rate(p.target),
            rate(p.achieved),
            millis(p.p50),
            millis(p.p99),
            millis(p.worst),
            _failed(p),
            f"{p.server_cpu / p.span:.0%} of a core",
            f"{p.generator_cpu / p.span:.0%} of a core",
            f"{p.server_rss / 2**20:.0f} MiB",
            f"{p.seen_writes:,}",
        )
    ours = [p for p in phases if p.server == OURS]
    base = {p.name: p for p in ours if p.agents == min(s.agents for s in sizes)}
    table.notes += [
        f"agents' server: scripts/start.sh agents, {server_workers} uvicorn processes, "
        "activate.settings.prod; the reference: bench/bare_asgi.py on the same uvicorn shape.",
        f"load: {processes} processes of bench/beat_load.py (uvloop) on the same 2 cores; each "
        "beat a distinct signed request (its agent's key, a nonce of its own, its scheduled time "
        "as timestamp) on a new connection closed after the answer, as the agent's urllib "
        "sends it; each agent at a random phase of its interval (30 s steady, 3 s in the burst).",
        "latency: from the beat's scheduled time to the whole answer read (the generator's own "
        "lateness included); answered: 2xx answers over the time from the first scheduled beat "
        "to the last answer; failed: any other status, refused or timed-out connection.",
        "last-seen writes: rows of the worker table PostgreSQL counted as updated during the "
        "phase (a worker's first beat in a minute writes last_heartbeat_at); the markers were "
        "spread over the minute before the first phase, as on a server that has heard the "
        "agents for a while.",
        "server RSS: the uvicorn processes' resident set, sampled 4 times a second.",
    ]
    for p in phases:
        table.notes.append(
            f"{p.server}, {p.agents:,}, {p.name}: {p.beats:,} beats over {p.duration:g} s, the "
            f"generator sent them at most {millis(p.lag_p99)} late (p99), "
            f"{p.open_at_most:,} connections open at most"
        )
    for size in sizes:
        table.notes.append(
            f"{size.agents:,} agents: connected through /agent/v1/connect in "
            f"{size.connect_seconds:.0f} s (8 at a time, for those added); Redis after the "
            f"burst: {size.redis_keys:,} keys of the run's database, "
            f"{size.redis_bytes / 2**20:.1f} MiB (MEMORY USAGE)"
        )
    for p in ours:
        first = base.get(p.name)
        if first is not None and first is not p:
            table.notes.append(
                f"growth, {p.name}, {first.agents:,} -> {p.agents:,} agents: p99 "
                f"{millis(first.p99)} -> {millis(p.p99)}, server CPU per beat "
                f"{first.server_cpu / max(first.beats, 1) * 1e6:.0f} -> "
                f"{p.server_cpu / max(p.beats, 1) * 1e6:.0f} us, RSS "
                f"{first.server_rss / 2**20:.0f} -> {p.server_rss / 2**20:.0f} MiB"
            )
    goals = []
    largest = max((p.agents for p in ours), default=0)
    for p in ours:
        if p.agents == largest and p.name.startswith("burst"):
            goals.append(
                Goal(
                    NAME,
                    f"beats at a {BURST}x burst from {largest:,} agents: p99 < "
                    f"{GOAL_P99 * 1000:.0f} ms, every beat accepted",
                    f"p99 {millis(p.p99)} at {rate(p.achieved)} of {rate(p.target)}, "
                    f"failed {_failed(p)}",
                    p.p99 < GOAL_P99 and not p.failures and p.answered_ok == p.beats,
                )
            )
    return Outcome([table], goals)

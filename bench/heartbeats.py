"""Heartbeats: sustained beats per second and latency against the deployed web server.

N connected workers with real per-worker secrets (created, marked submitted, connected through
/agent/v1/connect) beat /agent/v1/heartbeat from separate load-generator processes
(bench.beatload). Two loads per agent count: closed loop (each agent beats again as soon as it
is answered: the capacity) and open loop at the goal rate (latency at that rate). Then where a
beat's time goes, measured piece by piece.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.report import Goal, Outcome, Table, millis, percentile, rate
from harness import REPO, HarnessError
from harness.cluster import SshTarget
from harness.objects import CLUSTER_NAME, forget_workers, run_user, start_afresh
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform

NAME = "heartbeats"
# Open-loop rates tried below the measured capacity, as shares of it.
SUSTAINED_SHARES = (0.5, 0.75)
FAKE_JOB_IDS = 8_000_000


@dataclass
class Load:
    agents: int
    offered: float  # beats/s asked for; 0 = closed loop
    beats: int
    errors: int
    elapsed: float
    latencies: list[float]
    server_cpu: float
    client_cpu: float

    @property
    def per_second(self) -> float:
        return self.beats / self.elapsed


def _connected_agents(count: int, url: str) -> list[tuple[str, str]]:
    """Workers moved to connected the way a real job's agent gets there."""
    from workers_app import lifecycle
    from workers_app.models import Cluster, Worker, new_agent_secret

    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    owner = run_user()
    agents = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(count):
            secret, secret_hash = new_agent_secret()
            worker = Worker.objects.create(
                name=f"bench-hb-{i}", owner=owner, cluster=cluster, agent_secret_hash=secret_hash
            )
            job_id = str(FAKE_JOB_IDS + i)
            if not lifecycle.mark_submitted(worker, job_id=job_id):
                raise HarnessError("could not mark a benchmark worker submitted")
            answer = client.post(
                "/agent/v1/connect",
                json={"worker": worker.public_id, "hostname": "bench-node", "job_id": job_id},
                headers={"Authorization": f"Bearer {secret}"},
            )
            if answer.status_code != 200:
                raise HarnessError(f"connect answered {answer.status_code}: {answer.text[:200]}")
            agents.append((worker.public_id, secret))
    return agents


def _group_cpu(pid: int) -> float:
    """CPU seconds used so far by every process in the process group led by ``pid``."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields after the command: state ppid pgrp ... utime(12) stime(13).
        if int(fields[2]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def _load(
    platform: Platform,
    agents: list[tuple[str, str]],
    workdir: Path,
    *,
    offered: float,
    duration: float,
    processes: int,
) -> Load:
    web = platform.processes["web"]
    runs = []
    for index in range(processes):
        share = agents[index::processes]
        path = workdir / f"agents-{len(agents)}-{index}.json"
        path.write_text(json.dumps(share))
        argv = [
            sys.executable,
            "-m",
            "bench.beatload",
            "--url",
            platform.url,
            "--agents",
            str(path),
            "--duration",
            str(duration),
            "--warmup",
            "2",
            "--rate",
            str(offered / processes),
        ]
        runs.append(argv)
    started = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True) for argv in runs]
    # The server's CPU is read over the measured window only (after the 2 s warm-up).
    time.sleep(2)
    cpu_before = _group_cpu(web.pid)
    time.sleep(duration)
    server_cpu = _group_cpu(web.pid) - cpu_before
    results = []
    for process in started:
        out, _ = process.communicate(timeout=duration + 120)
        if process.returncode != 0:
            raise HarnessError("the load generator failed")
        results.append(json.loads(out))
    latencies = [x for r in results for x in r["latencies"]]
    return Load(
        agents=len(agents),
        offered=offered,
        beats=sum(r["beats"] for r in results),
        errors=sum(r["errors"] for r in results),
        elapsed=duration,
        latencies=latencies,
        server_cpu=server_cpu,
        client_cpu=sum(r["client_cpu"] for r in results),
    )


@dataclass
class Breakdown:
    round_trip: float  # one Redis command (PING) through redis-py
    service: float  # record_heartbeat: Redis only
    service_with_db: float  # record_heartbeat that also writes last_heartbeat_at
    django: float  # the whole Django app called as WSGI, in-process (no HTTP)


def _breakdown(public_id: str, secret: str, repeat: int) -> Breakdown:
    from django.core.handlers.wsgi import WSGIHandler

    from workers_app.agent_service import record_heartbeat
    from workers_app.heartbeats import SEEN_PREFIX, redis_client
    from workers_app.models import Worker

    worker_id = Worker.objects.get(public_id=public_id).pk
    client = redis_client()
    started = time.perf_counter()
    for _ in range(repeat):
        client.ping()
    round_trip = (time.perf_counter() - started) / repeat

    record_heartbeat(public_id, secret)
    started = time.perf_counter()
    for _ in range(repeat):
        record_heartbeat(public_id, secret)
    service = (time.perf_counter() - started) / repeat

    started = time.perf_counter()
    for _ in range(repeat // 4):
        client.delete(f"{SEEN_PREFIX}{worker_id}")
        record_heartbeat(public_id, secret)
    with_db = (time.perf_counter() - started) / (repeat // 4)

    handler = WSGIHandler()
    body = json.dumps({"worker": public_id}).encode()

    def environ() -> dict[str, object]:
        return {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/agent/v1/heartbeat",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": f"Bearer {secret}",
            "wsgi.input": io.BytesIO(body),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
        }

    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], *_: object) -> Any:
        statuses.append(status)
        return None

    started = time.perf_counter()
    for _ in range(repeat):
        response = handler(environ(), start_response)
        b"".join(response)
        response.close()
    django = (time.perf_counter() - started) / repeat
    if any(not s.startswith("200") for s in statuses):
        raise HarnessError(f"in-process heartbeat failed: {statuses[-1]}")
    return Breakdown(round_trip, service, with_db, django)


def run(
    target: SshTarget,
    *,
    agent_counts: tuple[int, ...] = (50, 200),
    goal_rate: float = 2000,
    duration: float = 10,
    web_workers: int = 2,
    web_threads: int = 4,
    load_processes: int = 2,
) -> Outcome:
    start_afresh(target)
    workdir = Path(tempfile.mkdtemp(prefix="bench-heartbeats-"))
    platform = Platform(workdir=workdir, knobs={**PRODUCTION_KNOBS, **NO_RECONCILE})
    loads: list[Load] = []
    try:
        platform.start_deployed_web(workers=web_workers, threads=web_threads)
        agents = _connected_agents(max(agent_counts), platform.url)
        for count in agent_counts:

            def measure(offered: float, count: int = count) -> Load:
                load = _load(
                    platform,
                    agents[:count],
                    workdir,
                    offered=offered,
                    duration=duration,
                    processes=load_processes,
                )
                loads.append(load)
                print(
                    f"  heartbeats: {count} agents, offered {offered or 'max'}: "
                    f"{load.per_second:.0f}/s, p99 {percentile(load.latencies, 99) * 1000:.1f} ms",
                    flush=True,
                )
                return load

            capacity = measure(0.0).per_second
            measure(goal_rate)
            # Below capacity: the rates this server sustains with short queues.
            for share in SUSTAINED_SHARES:
                measure(round(capacity * share, -1))
        breakdown = _breakdown(*agents[0], repeat=2000)
    finally:
        platform.stop_all()
        forget_workers()
    return _outcome(loads, breakdown, goal_rate, web_workers, web_threads, load_processes)


def _outcome(
    loads: list[Load],
    breakdown: Breakdown,
    goal_rate: float,
    web_workers: int,
    web_threads: int,
    load_processes: int,
) -> Outcome:
    table = Table(
        "Heartbeats: POST /agent/v1/heartbeat against the deployed web server",
        ["agents", "load", "beats/s", "p50", "p99", "errors", "server CPU/beat", "client CPU"],
    )
    for load in loads:
        table.add(
            load.agents,
            "closed loop (max)" if not load.offered else f"open loop, {rate(load.offered)}",
            rate(load.per_second),
            millis(percentile(load.latencies, 50)),
            millis(percentile(load.latencies, 99)),
            load.errors,
            f"{load.server_cpu / max(load.beats, 1) * 1e6:.0f} us",
            f"{load.client_cpu / load.elapsed:.0%} of a core",
        )
    table.notes += [
        f"server: scripts/start.sh web (gunicorn gthread, {web_workers} workers x {web_threads} "
        "threads, access log on but without successful beats, activate.settings.prod), Redis "
        "and PostgreSQL local.",
        f"load: {load_processes} bench.beatload processes (asyncio, one keep-alive connection per "
        "agent), 2 s warm-up then the measured window; open-loop latency counts from when a "
        "beat was due, so queueing behind a slow server is included.",
        "the load generator runs on the same 2 cores as the server: its CPU is taken from the "
        "server's budget.",
    ]
    server_cpu = [x.server_cpu / x.beats for x in loads if not x.offered and x.beats]
    per_beat = min(server_cpu) if server_cpu else float("nan")
    where = Table(
        "Where a heartbeat's server time goes (in-process, one at a time)", ["part", "time"]
    )
    where.add("one Redis command through redis-py (PING)", f"{breakdown.round_trip * 1e6:.0f} us")
    where.add(
        "record_heartbeat: one Redis round trip (a Lua script) + SHA-256",
        f"{breakdown.service * 1e6:.0f} us",
    )
    where.add(
        "record_heartbeat when it also writes last_heartbeat_at (once a minute per worker)",
        f"{breakdown.service_with_db * 1e6:.0f} us",
    )
    where.add(
        "the Django app as WSGI (fast path before the middleware, view, JSON), in-process",
        f"{breakdown.django * 1e6:.0f} us",
    )
    where.add(
        "gunicorn over HTTP, server CPU per beat at max load (all processes)",
        f"{per_beat * 1e6:.0f} us",
    )
    where.notes.append(
        "Django's share beyond the service is request/response handling and JSON; "
        "gunicorn's share beyond Django is HTTP parsing, sockets and threads. "
        f"At {per_beat * 1e6:.0f} us of server CPU per beat, 2 cores cap the server near "
        f"{2 / per_beat:,.0f} beats/s before the load generator takes its share."
        if server_cpu
        else "no closed-loop run to measure the server's CPU per beat"
    )
    for agents in sorted({x.agents for x in loads}):
        good = [
            x
            for x in loads
            if x.agents == agents
            and x.offered
            and x.errors == 0
            and percentile(x.latencies, 99) < 0.050
        ]
        best = max(good, key=lambda x: x.per_second, default=None)
        table.notes.append(
            f"{agents} agents: highest measured rate with p99 < 50 ms: "
            + (
                f"{rate(best.per_second)} (p99 {millis(percentile(best.latencies, 99))})"
                if best
                else "none of the rates tried"
            )
        )
    at_goal = [x for x in loads if x.offered == goal_rate]
    goals = []
    for load in at_goal:
        p99 = percentile(load.latencies, 99)
        goals.append(
            Goal(
                NAME,
                f"{load.agents} agents: >= {goal_rate:,.0f} beats/s with p99 < 50 ms",
                f"{load.per_second:,.0f}/s, p99 {millis(p99)}",
                load.per_second >= goal_rate * 0.98 and p99 < 0.050 and load.errors == 0,
            )
        )
    return Outcome([table, where], goals)

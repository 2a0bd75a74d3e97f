"""Terminals: heartbeats and the API while 50 terminals stay open, against the same without them.

One real worker on the test Slurm (connected through its agent); 50 terminals opened on it
through the web server's WebSocket, each a PTY inside the job (`srun --overlap --pty`) printing a
line a second, read by the client. Meanwhile agents beat the agents' server at a fixed rate and
one client lists workers at 20 requests a second. Rounds alternate without and with terminals,
so drift of a noisy machine falls on both sides.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.report import Goal, Outcome, Table, millis, percentile
from harness import REPO, HarnessError
from harness.agents import SignedAgent
from harness.cluster import SshTarget
from harness.objects import connected_worker_via_api, end_run, run_user, start_afresh
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform

NAME = "terminals"
API_RATE = 20.0
FAKE_JOB_IDS = 9_000_000
BEATERS = 8


@dataclass
class Round:
    terminals: int
    beat_latencies: list[float]
    beat_errors: int
    api_latencies: list[float]
    api_errors: int

    @property
    def beat_p99(self) -> float:
        return percentile(self.beat_latencies, 99)

    @property
    def api_p95(self) -> float:
        return percentile(self.api_latencies, 95)


def _agents(count: int, url: str) -> list[SignedAgent]:
    """Connected workers with real keys, made the way a job's agent gets there."""
    from workers_app.actions import lifecycle
    from workers_app.agent_keys import issue_agent_key
    from workers_app.models import Cluster, Worker
    from workers_app.statuses import WorkerStatus

    cluster = Cluster.objects.get(name="bench-slurm")
    agents = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(count):
            worker = Worker(name=f"bench-term-hb-{i}", owner=run_user(), cluster=cluster)
            key = issue_agent_key(worker.public_id)
            worker.agent_secret_hash = key.key_hash
            worker.save()
            agent = SignedAgent(worker.public_id, key.key_id, key.key)
            if not lifecycle.mark_submitted(worker, job_id=str(FAKE_JOB_IDS + i)):
                raise HarnessError("could not mark a benchmark worker submitted")
            # As a poll leaves it once the scheduler shows the job on a node, which connect takes.
            lifecycle.mark_started(worker, hostname="bench-node")
            answer = agent.post(
                client,
                "/agent/v1/connect",
                {
                    "worker": worker.public_id,
                    "hostname": "bench-node",
                    "job_id": str(FAKE_JOB_IDS + i),
                },
            )
            worker.refresh_from_db()
            if answer.status_code != 200 or worker.status != WorkerStatus.CONNECTED:
                raise HarnessError(
                    f"connect answered {answer.status_code}: {answer.response.text[:200]}"
                )
            agents.append(agent)
    return agents


def _paced(rate: float, duration: float, act: Callable[[float], None]) -> None:
    """``act(due)`` at ``rate`` a second (open loop): each is timed from when it was due, so a
    stall delays and counts against every call behind it."""
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < duration:
        due = start + sent / rate
        time.sleep(max(0.0, due - time.perf_counter()))
        act(due)
        sent += 1


def _measure(
    platform: Platform, key: str, agents: list[SignedAgent], beat_rate: float, duration: float
) -> tuple[list[float], int, list[float], int]:
    beats: list[float] = []
    api: list[float] = []
    errors = {"beat": 0, "api": 0}
    lock = threading.Lock()

    def beater(index: int) -> None:
        mine = agents[index::BEATERS]
        turn = 0
        with httpx.Client(base_url=platform.agent_url, timeout=30) as client:

            def beat(due: float) -> None:
                nonlocal turn
                agent = mine[turn % len(mine)]
                turn += 1
                answer = agent.post(client, "/agent/v1/heartbeat")
                took = time.perf_counter() - due
                with lock:
                    beats.append(took)
                    errors["beat"] += answer.status_code != 200

            _paced(beat_rate / BEATERS, duration, beat)

    def lister() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=platform.url, headers=headers, timeout=30) as client:

            def listing(due: float) -> None:
                answer = client.get("/api/workers/")
                took = time.perf_counter() - due
                api.append(took)
                errors["api"] += answer.status_code != 200

            _paced(API_RATE, duration, listing)

    with ThreadPoolExecutor(BEATERS + 1) as pool:
        jobs = [pool.submit(beater, i) for i in range(BEATERS)] + [pool.submit(lister)]
        for job in jobs:
            job.result()
    return beats, errors["beat"], api, errors["api"]


class Terminals:
    """Terminals held open by bench.terminal_holder, a process of its own."""

    def __init__(self, platform: Platform, key: str, public_id: str) -> None:
        self.url = platform.url.replace("http", "ws", 1) + f"/ws/workers/{public_id}/terminal/"
        self.key = key
        self.holder: subprocess.Popen[str] | None = None
        self.lines = 0
        # Terminal-seconds open: each terminal prints a line a second.
        self.expected = 0.0
        self.opened_at = 0.0
        self.count = 0

    def open(self, count: int) -> float:
        started = time.perf_counter()
        self.holder = subprocess.Popen(
            [sys.executable, "-m", "bench.terminal_holder", self.url, self.key, str(count)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        said = self.holder.stdout.readline().strip()
        if said != "ready":
            self.close()
            raise HarnessError(f"the terminals did not all start: {said}")
        self.opened_at, self.count = time.perf_counter(), count
        return self.opened_at - started

    def close(self) -> None:
        if self.holder is None:
            return
        said, _ = self.holder.communicate("", timeout=60)
        self.lines += int(said.strip() or 0) if said.strip().isdigit() else 0
        self.expected += self.count * (time.perf_counter() - self.opened_at)
        self.holder = None


def run(
    target: SshTarget,
    *,
    terminals: int = 50,
    beat_rate: float = 300,
    duration: float = 10,
    rounds: int = 2,
) -> Outcome:
    from workers_app.models import ApiKey

    start_afresh(target)
    owner = run_user()
    _, key = ApiKey.issue(owner, name="bench-terminals")
    workdir = Path(tempfile.mkdtemp(prefix="bench-terminals-"))
    knobs = {
        **PRODUCTION_KNOBS,
        **NO_RECONCILE,
        "ACTIVATE_TERMINALS_PER_USER": str(terminals + 10),
        "ACTIVATE_TERMINAL_IDLE_TIMEOUT": "600",
    }
    platform = Platform(workdir=workdir, knobs=knobs, web_as_shipped=True)
    results: list[Round] = []
    names: list[str] = []
    opened = 0.0
    shells: Terminals | None = None
    try:
        # The test settings' web server (uvicorn, 2 workers): it shares this process's secret key,
        # which the cluster's stored key is encrypted with.
        platform.start_web()
        platform.start_agents()
        platform.start_worker()
        with platform.api(key) as api:
            worker = connected_worker_via_api(api, names)
        agents = _agents(200, platform.agent_url)
        _measure(platform, key, agents, beat_rate, 3)  # warm-up
        shells = Terminals(platform, key, worker.public_id)
        for number in range(rounds):
            for count in (0, terminals):
                if count:
                    opened = shells.open(count)
                    time.sleep(2)
                measured = _measure(platform, key, agents, beat_rate, duration)
                results.append(Round(count, *measured))
                print(
                    f"  terminals: round {number + 1}, {count} open: beat p99 "
                    f"{results[-1].beat_p99 * 1000:.1f} ms, API p95 "
                    f"{results[-1].api_p95 * 1000:.1f} ms",
                    flush=True,
                )
                if count:
                    shells.close()
                    time.sleep(2)
        lines, expected = shells.lines, shells.expected
    finally:
        if shells is not None:
            shells.close()
        end_run(platform, target, names)
        ApiKey.objects.filter(user=owner).delete()
    return _outcome(results, terminals, beat_rate, duration, opened, lines, expected)


def _outcome(
    results: list[Round],
    terminals: int,
    beat_rate: float,
    duration: float,
    opened: float,
    lines: int,
    expected: float,
) -> Outcome:
    table = Table(
        f"Terminals: heartbeats and API with {terminals} terminals open vs none",
        ["round", "terminals", "beats", "beat p50", "beat p99", "API p50", "API p95", "errors"],
        align="lrrrrrrr",
    )
    for index, r in enumerate(results):
        table.add(
            index // 2 + 1,
            r.terminals,
            len(r.beat_latencies),
            millis(percentile(r.beat_latencies, 50)),
            millis(r.beat_p99),
            millis(percentile(r.api_latencies, 50)),
            millis(r.api_p95),
            r.beat_errors + r.api_errors,
        )
    without = [r for r in results if not r.terminals]
    loaded = [r for r in results if r.terminals]
    beat_without = statistics.median(r.beat_p99 for r in without)
    beat_with = statistics.median(r.beat_p99 for r in loaded)
    api_without = statistics.median(r.api_p95 for r in without)
    api_with = statistics.median(r.api_p95 for r in loaded)
    table.notes += [
        f"each round {duration:g} s: {beat_rate:g} beats/s from {BEATERS} client threads over "
        f"200 agents with real secrets to the agents' server, and GET /api/workers/ at "
        f"{API_RATE:g}/s to the web server (uvicorn, 2 workers, as scripts/start.sh web).",
        f"terminals: PTYs in one real job (`srun --overlap --pty`), each printing a line a "
        f"second; {terminals} opened in {opened:.1f} s, {lines:,} lines read in all "
        f"(about {expected:,.0f} printed while they were open).",
        "beats and API calls are sent at a steady rate and each is timed from when it was due "
        "(a stall counts against every call behind it).",
        "machine: 2 cores of a shared VM; the load generator runs on the same cores.",
    ]
    errors = sum(r.beat_errors + r.api_errors for r in results)
    goals = [
        Goal(
            NAME,
            "the terminals' output flowed: >= 80% of the lines printed were read",
            f"{lines:,} of about {expected:,.0f}",
            lines >= 0.8 * expected > 0,
        ),
        Goal(
            NAME,
            f"heartbeat p99 with {terminals} terminals within 20% of without",
            f"{millis(beat_with)} vs {millis(beat_without)} (median of rounds)",
            beat_with <= 1.2 * beat_without and errors == 0,
        ),
        Goal(
            NAME,
            f"API p95 with {terminals} terminals within 20% of without",
            f"{millis(api_with)} vs {millis(api_without)} (median of rounds)",
            api_with <= 1.2 * api_without and errors == 0,
        ),
    ]
    return Outcome(tables=[table], goals=goals)

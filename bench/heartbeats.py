"""Heartbeats: beats per second and latency of the agents' server, with `wrk`, side by side.

N connected workers with real per-worker keys (created, marked submitted, connected through
/agent/v1/connect) are beaten by `wrk` (Debian's package, C, closed loop: a fixed number of
connections each sending the next agent's beat as soon as the last is answered), against three
servers of the same shape, one after the other, in one run. Beats are signed (a nonce each, a
timestamp within the server's window): wrk's Lua has no HMAC, so before each wrk run this
process signs enough distinct beats for it, as the agents would, into a file wrk reads
(bench/wrk_beats.lua); a run that used them all up would replay some, so it is refused.
- ours: `scripts/start.sh agents` (uvicorn, the lean ASGI heartbeat path, production settings);
- a bare Django view doing one Redis SET, gunicorn with the shape the agents' server had
  (the usual Python way, and the goal's yardstick);
- a plain ASGI callable doing one Redis SET, no checks (about what Python serves at most).
Each under both connection patterns agents have: one connection kept across beats (the agent's
own, node/activate_agent.py), and a new connection per beat (an agent whose kept connection the
server closed while idle: uvicorn closes one idle 5 s unless told otherwise), ours against the
plain ASGI callable under the same pattern.
Then where a beat's time goes, measured piece by piece in-process.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.report import Goal, Outcome, Table, millis, rate, times
from harness import REPO, HarnessError
from harness.agents import SignedAgent
from harness.cluster import SshTarget
from harness.objects import CLUSTER_NAME, forget_workers, run_user, start_afresh
from harness.platform import BIN, NO_RECONCILE, PRODUCTION_KNOBS, START, Platform, free_port
from harness.waiting import wait_until

NAME = "heartbeats"
FAKE_JOB_IDS = 8_000_000
WRK_SCRIPT = Path(__file__).with_name("wrk_beats.lua")
GOAL_RATE = 5000
GOAL_OVER_DJANGO = 2.5
# Signed beats prepared per second of a wrk run: more than any of the servers reaches.
SUPPLY_RATE = 30_000
BEAT_PATH = "/agent/v1/heartbeat"
OURS = "ours: scripts/start.sh agents (uvicorn, lean ASGI heartbeat)"
BARE_DJANGO = "bare Django view + one Redis SET (gunicorn)"
BARE_ASGI = "plain ASGI callable + one Redis SET, no checks (uvicorn)"
OURS_REPORTING = "ours, 1 beat in 10 carrying the agent's activity report"
# The agent keeps its connection across beats, and opens a new one when the server closed it
# while idle (uvicorn after 5 s unless told otherwise): both stacks measured that way too.
OURS_PER_BEAT = "ours, a new connection per beat"
BARE_ASGI_PER_BEAT = "plain ASGI callable, a new connection per beat"
# The defaults' rate: a report every ACTIVATE_ACTIVITY_INTERVAL (300 s) with a beat every
# ACTIVATE_HEARTBEAT_INTERVAL (30 s).
REPORT_EVERY = 10
GOAL_REPORT_COST = 0.05
# The fair reference: the same server stack with nothing checked (the bare Django view is
# mostly another stack).
GOAL_OF_PLAIN = 0.8


@dataclass
class Round:
    server: str
    round: int
    connections: int
    requests: int
    elapsed: float
    socket_errors: int
    non_2xx: int
    p50: float
    p99: float
    worst: float
    server_cpu: float

    @property
    def per_second(self) -> float:
        return self.requests / self.elapsed

    @property
    def errors(self) -> int:
        return self.socket_errors + self.non_2xx


def _connected_agents(count: int, url: str, secret_key: str) -> list[SignedAgent]:
    """Workers moved to connected the way a real job's agent gets there (their keys derived
    with the agents' server's secret key)."""
    from workers_app.actions import lifecycle
    from workers_app.agent_keys import issue_agent_key
    from workers_app.models import Cluster, Worker

    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    owner = run_user()
    agents = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(count):
            worker = Worker(name=f"bench-hb-{i}", owner=owner, cluster=cluster)
            key = issue_agent_key(worker.public_id, secret_key=secret_key)
            worker.agent_secret_hash = key.key_hash
            worker.save()
            agent = SignedAgent(worker.public_id, key.key_id, key.key)
            job_id = str(FAKE_JOB_IDS + i)
            if not lifecycle.mark_submitted(worker, job_id=job_id):
                raise HarnessError("could not mark a benchmark worker submitted")
            # As a poll leaves it once the scheduler shows the job on a node, which connect takes.
            lifecycle.mark_started(worker, hostname="bench-node")
            answer = agent.post(
                client,
                "/agent/v1/connect",
                {"worker": worker.public_id, "hostname": "bench-node", "job_id": job_id},
            )
            if answer.status_code != 200 or not answer.signed:
                raise HarnessError(
                    f"connect answered {answer.status_code}: {answer.response.text[:200]}"
                )
            agents.append(agent)
    return agents


def _report(agent_number: int) -> str:
    """An activity report as an agent sends it: its job, and two session launchers."""
    busy = agent_number % 3 == 0
    cpu = "287.50" if busy else "0.42"
    sessions = f"s{agent_number:09d}a:{cpu}:1048576,s{agent_number:09d}b:0.00:0"
    return f', "span": "300.0", "cpu": "{cpu}", "io": "52428800", "sessions": "{sessions}"'


def _sign_beats(
    agents: list[SignedAgent], path: Path, count: int, *, report_every: int = 0
) -> None:
    """``count`` distinct signed beats, the agents' in turn, one a line: worker, Authorization,
    body; with ``report_every``, each agent's every so many beats carries an activity report."""
    lines = []
    # Each agent's beats a microsecond apart, as a real agent's (whose times go strictly up):
    # one agent's consecutive beats are len(agents) requests apart, far more than wrk keeps in
    # flight, so one overtaking another (refused, and counted as an error) is rare.
    start = int(time.time() * 1_000_000)
    for i in range(count):
        agent = agents[i % len(agents)]
        number, beat = i % len(agents), i // len(agents)
        report = _report(number) if report_every and (beat + number) % report_every == 0 else ""
        body = f'{{"worker": "{agent.public_id}"{report}}}'
        seconds, micros = divmod(start + beat, 1_000_000)
        header, _ = agent.signed(BEAT_PATH, body.encode(), ts=f"{seconds}.{micros:06d}")
        lines.append(f"{agent.public_id}\t{header}\t{body}\n")
    path.write_text("".join(lines))


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


def wrk_binary() -> str:
    """wrk, installed from Debian's packages (as root) if it is missing."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise HarnessError("wrk is missing: install it (apt-get install wrk) or run as root")
    print("  installing wrk (apt-get install wrk)", flush=True)
    install = ["apt-get", "install", "-y", "-q", "wrk"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": False}
    if subprocess.run(install, **quiet).returncode != 0:  # type: ignore[call-overload]
        subprocess.run(["apt-get", "update", "-q"], **quiet)  # type: ignore[call-overload]
        subprocess.run(install, check=True, stdout=subprocess.DEVNULL)
    found = shutil.which("wrk")
    if not found:
        raise HarnessError("wrk could not be installed")
    return found


def _wrk(
    wrk: str,
    url: str,
    agents: list[SignedAgent],
    workdir: Path,
    *,
    connections: int,
    threads: int,
    duration: float,
    report_every: int = 0,
    per_beat_connection: bool = False,
) -> dict[str, int]:
    beats = workdir / "beats.txt"
    supply = int(SUPPLY_RATE * duration)
    _sign_beats(agents, beats, supply, report_every=report_every)
    argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--timeout", "5s"]
    argv += ["-s", str(WRK_SCRIPT), url, "--", str(beats), str(threads)]
    argv += ["close"] if per_beat_connection else []
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=duration + 60, check=False
    )
    beats.unlink()
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise HarnessError(f"wrk failed: {result.stderr.strip()[:300]} {result.stdout[-300:]}")
    answer: dict[str, int] = json.loads(lines[-1])
    if answer["requests"] > supply:
        raise HarnessError(
            f"wrk sent {answer['requests']} beats, more than the {supply} signed ones prepared: "
            "raise SUPPLY_RATE"
        )
    return answer


def _measure(
    wrk: str,
    server: str,
    leader: int,
    url: str,
    agents: list[SignedAgent],
    workdir: Path,
    *,
    connections: int,
    threads: int,
    duration: float,
    round_number: int,
    report_every: int = 0,
    per_beat_connection: bool = False,
) -> Round:
    def run_wrk(seconds: float) -> dict[str, int]:
        return _wrk(
            wrk,
            url,
            agents,
            workdir,
            connections=connections,
            threads=threads,
            duration=seconds,
            report_every=report_every,
            per_beat_connection=per_beat_connection,
        )

    # A short warm-up first: connections, caches, uvicorn's and gunicorn's workers all busy.
    run_wrk(2)
    cpu_before = _group_cpu(leader)
    answer = run_wrk(duration)
    server_cpu = _group_cpu(leader) - cpu_before
    measured = Round(
        server=server,
        round=round_number,
        connections=connections,
        requests=answer["requests"],
        elapsed=answer["duration_us"] / 1e6,
        socket_errors=answer["socket_errors"],
        non_2xx=answer["non_2xx"],
        p50=answer["p50_us"] / 1e6,
        p99=answer["p99_us"] / 1e6,
        worst=answer["max_us"] / 1e6,
        server_cpu=server_cpu,
    )
    print(
        f"  heartbeats: {server} round {round_number}: {measured.per_second:,.0f}/s, "
        f"p99 {millis(measured.p99)}, errors {measured.errors}",
        flush=True,
    )
    return measured


@dataclass
class Breakdown:
    round_trip: float  # one Redis command (PING) through redis-py
    service: float  # record_heartbeat: Redis only
    service_with_db: float  # record_heartbeat that also writes last_heartbeat_at
    signatures: float  # checking a beat's signature and signing its answer
    django: float  # the whole Django app called as WSGI, in-process (no HTTP)
    script_client: float  # CPU per beat script sent through redis.asyncio's client, 50 at once
    script_pipelined: float  # the same on the agents' server's pipelined connection


def _breakdown(agent: SignedAgent, secret_key: str, repeat: int) -> Breakdown:
    from django.core.handlers.wsgi import WSGIHandler
    from django.test import override_settings

    from agents import signing
    from agents.beats import SEEN_PREFIX
    from agents.service import record_heartbeat
    from core.redis_connection import redis_client
    from workers_app.models import Worker, hash_secret

    worker_id = Worker.objects.get(public_id=agent.public_id).pk
    key_hash = hash_secret(agent.key)
    client = redis_client()
    started = time.perf_counter()
    for _ in range(repeat):
        client.ping()
    round_trip = (time.perf_counter() - started) / repeat

    record_heartbeat(agent.public_id, key_hash)
    started = time.perf_counter()
    for _ in range(repeat):
        record_heartbeat(agent.public_id, key_hash)
    service = (time.perf_counter() - started) / repeat

    started = time.perf_counter()
    for _ in range(repeat // 4):
        client.delete(f"{SEEN_PREFIX}{worker_id}")
        record_heartbeat(agent.public_id, key_hash)
    with_db = (time.perf_counter() - started) / (repeat // 4)

    body = json.dumps({"worker": agent.public_id}).encode()
    headers = [agent.signed(BEAT_PATH, body)[0] for _ in range(repeat)]
    with override_settings(SECRET_KEY=secret_key):
        started = time.perf_counter()
        for header in headers:
            call = signing.verify_request(header, "POST", BEAT_PATH, body, now=time.time())
            signing.sign_answer(call, 200, b'{"status": "ok"}')
        signatures = (time.perf_counter() - started) / repeat

    handler = WSGIHandler()
    headers = [agent.signed(BEAT_PATH, body)[0] for _ in range(repeat)]

    def environ(header: str) -> dict[str, object]:
        return {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": BEAT_PATH,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": header,
            "wsgi.input": io.BytesIO(body),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
        }

    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], *_: object) -> Any:
        statuses.append(status)
        return None

    with override_settings(SECRET_KEY=secret_key):
        started = time.perf_counter()
        for header in headers:
            response = handler(environ(header), start_response)
            b"".join(response)
            response.close()
        django = (time.perf_counter() - started) / repeat
    if any(not s.startswith("200") for s in statuses):
        raise HarnessError(f"in-process heartbeat failed: {statuses[-1]}")
    script_client, script_pipelined = _script_cpu(agent.public_id, key_hash, repeat * 5)
    return Breakdown(
        round_trip, service, with_db, signatures, django, script_client, script_pipelined
    )


def _script_cpu(public_id: str, key_hash: str, repeat: int) -> tuple[float, float]:
    """This process's CPU per beat script (a cached agent's beat, its nonce left out) sent by 50
    callers at once on one event loop: through redis.asyncio's client, and pipelined."""
    import uvloop

    from agents.beats import BEAT_SCRIPT, AgentBeats
    from agents.pipelined import PipelinedScript
    from agents.service import LAST_SEEN_GRANULARITY
    from core.redis_connection import async_redis_client

    call = AgentBeats().beat_arguments(public_id, key_hash, seen_window=LAST_SEEN_GRANULARITY)

    async def measure() -> tuple[float, float]:
        client = async_redis_client()
        through_client = client.register_script(BEAT_SCRIPT)
        pipelined = PipelinedScript(client, BEAT_SCRIPT)
        took = []
        for script in (through_client, pipelined, through_client, pipelined):

            async def caller(script: Any = script) -> None:
                for _ in range(repeat // 50):
                    await script(keys=call.keys, args=call.args)

            started = time.process_time()
            await asyncio.gather(*(caller() for _ in range(50)))
            took.append((time.process_time() - started) / (repeat // 50 * 50))
        await pipelined.close()
        await client.aclose()
        return min(took[0], took[2]), min(took[1], took[3])

    return uvloop.run(measure())


def _start_ours(platform: Platform, workers: int, secret_key: str) -> subprocess.Popen[bytes]:
    """The agents' server as `scripts/start.sh agents` runs it, with production settings."""
    environ = platform.env()
    environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "activate.settings.prod",
            "ACTIVATE_SECRET_KEY": secret_key,
            "ACTIVATE_AGENT_WORKERS": str(workers),
            "ACTIVATE_AGENT_PLAIN_HTTP": "true",
        }
    )
    process = platform._spawn("agents", ["bash", str(START), "agents"], environ, "start.sh agents")
    platform._ready(platform._agents_answer, "the agents' server did not answer")
    return process


def _start_bare(argv: list[str], log: Path, url: str) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/5")}
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, cwd=REPO, env=environ, stdout=out, stderr=out, start_new_session=True
        )

    def answers() -> bool:
        try:
            return httpx.post(f"{url}/agent/v1/heartbeat", content=b"{}", timeout=2).is_success
        except httpx.HTTPError:
            return False

    if not wait_until(answers, timeout=60):
        _stop(process)
        raise HarnessError(f"{argv[0]} did not answer: {log.read_text()[-500:]}")
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run(
    target: SshTarget,
    *,
    agent_count: int = 1000,
    connections: int = 50,
    duration: float = 12,
    rounds: int = 2,
    server_workers: int = 2,
    django_threads: int = 4,
    wrk_threads: int = 2,
) -> Outcome:
    wrk = wrk_binary()
    start_afresh(target)
    workdir = Path(tempfile.mkdtemp(prefix="bench-heartbeats-"))
    platform = Platform(workdir=workdir, knobs={**PRODUCTION_KNOBS, **NO_RECONCILE})
    bare: list[subprocess.Popen[bytes]] = []
    measured: list[Round] = []
    try:
        secret_key = secrets.token_urlsafe(40)
        ours = _start_ours(platform, server_workers, secret_key)
        agents = _connected_agents(agent_count, platform.agent_url, secret_key)
        django_url = f"http://127.0.0.1:{free_port()}"
        django_argv = [str(BIN / "gunicorn"), "bench.bare_django:application", "--bind"]
        django_argv += [django_url.removeprefix("http://"), "--workers", str(server_workers)]
        django_argv += ["--threads", str(django_threads)]
        bare.append(_start_bare(django_argv, workdir / "bare-django.log", django_url))
        asgi_url = f"http://127.0.0.1:{free_port()}"
        host, port = asgi_url.removeprefix("http://").split(":")
        asgi_argv = [str(BIN / "uvicorn"), "bench.bare_asgi:application", "--host", host]
        asgi_argv += ["--port", port, "--workers", str(server_workers), "--loop", "uvloop"]
        asgi_argv += ["--http", "httptools", "--no-access-log"]
        bare.append(_start_bare(asgi_argv, workdir / "bare-asgi.log", asgi_url))
        servers = [
            (OURS, ours.pid, platform.agent_url, 0, False),
            (OURS_REPORTING, ours.pid, platform.agent_url, REPORT_EVERY, False),
            (BARE_DJANGO, bare[0].pid, django_url, 0, False),
            (BARE_ASGI, bare[1].pid, asgi_url, 0, False),
            (OURS_PER_BEAT, ours.pid, platform.agent_url, 0, True),
            (BARE_ASGI_PER_BEAT, bare[1].pid, asgi_url, 0, True),
        ]
        for round_number in range(1, rounds + 1):
            for server, leader, url, report_every, per_beat_connection in servers:
                measured.append(
                    _measure(
                        wrk,
                        server,
                        leader,
                        url,
                        agents,
                        workdir,
                        connections=connections,
                        threads=wrk_threads,
                        duration=duration,
                        round_number=round_number,
                        report_every=report_every,
                        per_beat_connection=per_beat_connection,
                    )
                )
        breakdown = _breakdown(agents[0], secret_key, repeat=2000)
    finally:
        for process in bare:
            _stop(process)
        platform.stop_all()
        forget_workers()
    shape = {
        OURS: f"uvicorn, {server_workers} worker processes (uvloop, httptools), access log "
        "without successful beats, activate.settings.prod",
        BARE_DJANGO: f"gunicorn gthread, {server_workers} workers x {django_threads} threads, "
        "no middleware",
        BARE_ASGI: f"uvicorn, {server_workers} worker processes (uvloop, httptools), no access log",
        OURS_REPORTING: "the same server; each agent's every 10th beat carries a report (the "
        "job's CPU and I/O over 300 s, two session launchers), as at the default intervals",
        OURS_PER_BEAT: "the same server; each beat asks Connection: close, so wrk opens a new "
        "connection for the next (as an agent does whose kept connection was closed while idle)",
        BARE_ASGI_PER_BEAT: "the same plain ASGI server, a new connection per beat",
    }
    return _outcome(measured, breakdown, shape, agent_count, connections, wrk_threads, duration)


def _cpu_per_beat(rounds: list[Round]) -> float:
    return _mean([r.server_cpu / r.requests for r in rounds if r.requests])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _outcome(
    measured: list[Round],
    breakdown: Breakdown,
    shape: dict[str, str],
    agent_count: int,
    connections: int,
    wrk_threads: int,
    duration: float,
) -> Outcome:
    table = Table(
        f"Heartbeats: POST /agent/v1/heartbeat from {agent_count} agents, wrk closed loop, "
        f"{connections} connections",
        ["server", "round", "beats/s", "p50", "p99", "max", "errors", "server CPU/beat"],
        align="lrrrrrrr",
    )
    for r in measured:
        table.add(
            r.server,
            r.round,
            rate(r.per_second),
            millis(r.p50),
            millis(r.p99),
            millis(r.worst),
            r.errors,
            f"{r.server_cpu / max(r.requests, 1) * 1e6:.0f} us",
        )
    by_server = {server: [r for r in measured if r.server == server] for server in shape if server}
    ours = by_server[OURS]
    django = by_server[BARE_DJANGO]
    asgi = by_server[BARE_ASGI]
    ours_rate = _mean([r.per_second for r in ours])
    django_rate = _mean([r.per_second for r in django])
    asgi_rate = _mean([r.per_second for r in asgi])
    ours_p99 = max((r.p99 for r in ours), default=float("nan"))
    reporting = by_server[OURS_REPORTING]
    per_beat = by_server[OURS_PER_BEAT]
    per_beat_rate = _mean([r.per_second for r in per_beat])
    asgi_per_beat_rate = _mean([r.per_second for r in by_server[BARE_ASGI_PER_BEAT]])
    reporting_rate = _mean([r.per_second for r in reporting])
    rate_cost = 1 - reporting_rate / ours_rate
    cpu_cost = _cpu_per_beat(reporting) / _cpu_per_beat(ours) - 1
    table.notes += [f"{server}: {text}" for server, text in shape.items()]
    table.notes += [
        f"load: wrk {wrk_threads} threads, {connections} keep-alive connections, closed loop, "
        f"{duration:g} s per round after a 2 s warm-up; every beat is the next agent's (its own "
        "worker id, signed with its key, a nonce each: signed beforehand by this process, "
        f"{SUPPLY_RATE:,} per second of run, bench/wrk_beats.lua); the bare servers check "
        "nothing and answer "
        "the same JSON.",
        "all three servers run at once (idle when not measured) and are measured in turn, "
        "round after round; wrk runs on the same 2 cores, so its CPU comes out of the server's.",
        f"mean over rounds: ours {rate(ours_rate)}, bare Django {rate(django_rate)} "
        f"(ours is {times(ours_rate / django_rate)} that), plain ASGI {rate(asgi_rate)} "
        f"(ours is {ours_rate / asgi_rate:.0%} of it).",
        f"a new connection per beat (agents keep theirs; this is their way when the server "
        f"closed it while idle): ours {rate(per_beat_rate)} "
        f"({_cpu_per_beat(per_beat) * 1e6:.0f} us of server CPU a beat, against "
        f"{_cpu_per_beat(ours) * 1e6:.0f} us kept alive), plain ASGI "
        f"{rate(asgi_per_beat_rate)} (ours is {per_beat_rate / asgi_per_beat_rate:.0%} of it).",
    ]
    where = Table(
        "Where a heartbeat's server time goes (in-process, one at a time)", ["part", "time"]
    )
    where.add("one Redis command through redis-py (PING)", f"{breakdown.round_trip * 1e6:.0f} us")
    where.add(
        "record_heartbeat: one Redis round trip (a Lua script, the nonce included)",
        f"{breakdown.service * 1e6:.0f} us",
    )
    where.add(
        "checking a beat's signature (HMAC, window) and signing its answer",
        f"{breakdown.signatures * 1e6:.0f} us",
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
        "the beat's Lua script through redis.asyncio's client, 50 at once: CPU per beat",
        f"{breakdown.script_client * 1e6:.0f} us",
    )
    where.add(
        "the same pipelined on one connection (agents/pipelined.py, the agents' server's way)",
        f"{breakdown.script_pipelined * 1e6:.0f} us",
    )
    for server, rounds in by_server.items():
        cpu = _cpu_per_beat(rounds)
        where.add(f"{server}: server CPU per beat under wrk (all processes)", f"{cpu * 1e6:.0f} us")
    goals = [
        Goal(
            NAME,
            f">= {GOAL_RATE:,} beats/s with p99 < 50 ms (agents' server, {agent_count} agents)",
            f"{rate(ours_rate)} (mean), worst p99 {millis(ours_p99)}",
            ours_rate >= GOAL_RATE and ours_p99 < 0.050 and all(r.errors == 0 for r in ours),
        ),
        Goal(
            NAME,
            f">= {GOAL_OVER_DJANGO:g}x a bare Django view doing one Redis SET, same run and shape",
            f"{times(ours_rate / django_rate)} ({rate(ours_rate)} vs {rate(django_rate)})",
            ours_rate >= GOAL_OVER_DJANGO * django_rate,
        ),
        Goal(
            NAME,
            f">= {GOAL_OF_PLAIN:.0%} of a plain ASGI callable doing one Redis SET and no checks, "
            "same server stack and run, connections kept across beats (as agents keep theirs)",
            f"{ours_rate / asgi_rate:.0%} ({rate(ours_rate)} vs {rate(asgi_rate)})",
            ours_rate >= GOAL_OF_PLAIN * asgi_rate,
        ),
        Goal(
            NAME,
            f">= {GOAL_OF_PLAIN:.0%} of the plain ASGI callable with a new connection per beat, "
            "both that way",
            f"{per_beat_rate / asgi_per_beat_rate:.0%} ({rate(per_beat_rate)} vs "
            f"{rate(asgi_per_beat_rate)})",
            per_beat_rate >= GOAL_OF_PLAIN * asgi_per_beat_rate
            and all(r.errors == 0 for r in per_beat),
        ),
        Goal(
            NAME,
            f"the agents' activity reports cost beats < {GOAL_REPORT_COST:.0%} (1 beat in "
            f"{REPORT_EVERY} carrying one, same server and run)",
            f"{rate(reporting_rate)} vs {rate(ours_rate)}: {rate_cost:+.1%} of the rate; "
            f"server CPU per beat {cpu_cost:+.1%}",
            rate_cost < GOAL_REPORT_COST and all(r.errors == 0 for r in reporting),
        ),
    ]
    return Outcome([table, where], goals)

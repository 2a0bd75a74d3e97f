"""Fail the Redis master over under Sentinel with 200 agents beating and requests flowing.

The platform runs with REDIS_URL the sentinel:// URL of scripts/sentinel.sh's set (a master on
6390, its replica on 6391, three sentinels, down after 1 s). A few real workers run on the test
cluster; beside them a crowd of agents (harness/agent_crowd.py: the real agent's code, one
process, a thread each) connects workers of their own and beats at the platform's interval.
With a request made every second, the master is SIGKILLed (by its pidfile) and the sentinels
promote the replica. Then: every agent of the crowd has a beat answered as accepted within
``bound`` seconds of the promotion; no worker changes status (the real ones' agents are judged
so); a heartbeat sweep completes again within ``bound`` (Celery beat and the sweeper through
the promoted broker); every request made around the kill ends in exactly one job and connects;
no platform process ends and no Celery process exits. The workers' heartbeat keys on the new
master are noted, not judged: the sweep's grace after its own gap sets them all, whether any
beat got through or not (shown with the agents' server pinned to the lost master). The set is
put back in its known state afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.sentinel import Sentinel

from core.env import sentinel_address
from core.redis_connection import client_for
from core.sweep_lag import DONE_KEY
from drills.drill import Drill, DrillResult, now, pause
from harness import REPO, HarnessError
from harness.agents import AgentCall, AgentCrowd, crowd_workers
from harness.cluster import SshTarget
from harness.objects import RUN_ENVIRONMENT

NAME = "Redis master fails over under Sentinel"
SCRIPT = REPO / "scripts" / "sentinel.sh"
BEAT_PATH = "/agent/v1/heartbeat"
# What a Celery worker or the sweeper logs when it exits by itself, and scripts/start.sh when it
# starts one again.
CELERY_DIED = "Unrecoverable error"
CELERY_RESTARTED = "starting it again"


def sentinel_up() -> dict[str, str]:
    """The set in its known state; its env file's values."""
    for command in ("up", "env"):
        done = subprocess.run(
            ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise HarnessError(f"scripts/sentinel.sh {command} failed: {done.stderr[-500:]}")
    lines = Path(done.stdout.strip()).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def master_port(url: str) -> int:
    address = sentinel_address(url)
    sentinels = Sentinel(
        address.sentinels,
        sentinel_kwargs={"password": address.sentinel_password, "socket_timeout": 1},
    )
    return int(sentinels.discover_master(address.service)[1])


def kill_master(url: str, run_dir: Path) -> int:
    port = master_port(url)
    pid = int((run_dir / f"redis-{port}.pid").read_text())
    if not Path(f"/proc/{pid}/comm").read_text().startswith("redis-server"):
        raise HarnessError(f"pid {pid} of redis-{port}.pid is not redis-server")
    os.kill(pid, signal.SIGKILL)
    return port


def wait_for_promotion(url: str, old_port: int, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if master_port(url) != old_port:
                return time.monotonic()
        except redis.RedisError:
            pass  # a sentinel away or mid-election: ask again
        time.sleep(0.05)
    raise HarnessError(f"no replica promoted within {timeout:g} s of killing the master")


@dataclass
class Heard:
    """What Redis showed after the promotion, in seconds after it: each worker's heartbeat key
    first set again, and a heartbeat sweep's first completion noted (None: none seen)."""

    beats: dict[int, float] = field(default_factory=dict)
    sweep: float | None = None


def heard_after(
    url: str, worker_ids: list[int], since: float, *, ttl_ms: int, timeout: float
) -> Heard:
    """Watched for ``timeout`` seconds after ``since`` (monotonic): each worker's key set again
    (read from its remaining TTL out of ``ttl_ms``, the platform's heartbeat timeout; a worker
    absent was not heard) and the heartbeat sweep's completion (core/sweep_lag.py)."""
    client = client_for(url)
    heard = Heard()
    since_epoch = time.time() - (time.monotonic() - since)
    deadline = since + timeout
    while (len(heard.beats) < len(worker_ids) or heard.sweep is None) and (
        time.monotonic() < deadline
    ):
        try:
            pipe = client.pipeline(transaction=False)
            for pk in worker_ids:
                pipe.pttl(f"activate:hb:{pk}")
            pipe.get(f"{DONE_KEY}heartbeats")
            *ttls, swept = pipe.execute()
        except redis.RedisError:  # the drill's own reads fail over too
            time.sleep(0.1)
            continue
        read_at = time.monotonic()
        for pk, remaining in zip(worker_ids, ttls, strict=True):
            set_at = read_at - (ttl_ms - remaining) / 1000
            if pk not in heard.beats and remaining > 0 and set_at > since:
                heard.beats[pk] = set_at - since
        if heard.sweep is None and swept is not None and float(swept) > since_epoch:
            heard.sweep = float(swept) - since_epoch
        time.sleep(0.1)
    return heard


def first_accepted(calls: list[AgentCall], since: float) -> dict[int, float]:
    """Seconds after ``since`` (epoch) at which each agent's first beat answered after it was
    accepted, by worker id."""
    found: dict[int, float] = {}
    for call in sorted(calls, key=lambda c: c.answered):
        if call.path == BEAT_PATH and call.accepted and call.answered > since:
            found.setdefault(call.member.worker_id, call.answered - since)
    return found


def spread(seconds: list[float], of: int) -> str:
    """Max and 99th percentile (nearest rank) of ``seconds``, and how many of ``of`` there are."""
    if not seconds:
        return f"none of {of}"
    ordered = sorted(seconds)
    p99 = ordered[max(0, -(-99 * len(ordered) // 100) - 1)]
    return f"max {ordered[-1]:.2f} s, p99 {p99:.2f} s ({len(ordered)}/{of})"


class RequestStream(threading.Thread):
    """One worker requested through the API every ``every`` seconds, ``count`` times."""

    def __init__(self, drill: Drill, count: int, every: float) -> None:
        super().__init__(daemon=True)
        self.drill, self.count, self.every = drill, count, every
        self.made: list[int] = []
        self.refused: list[str] = []
        self.answered_at: list[float] = []  # when each request made was answered (monotonic)

    def run(self) -> None:
        from django.db import connection

        try:
            for _ in range(self.count):
                started = time.monotonic()
                try:
                    self.made += [w.pk for w in self.drill.request(RUN_ENVIRONMENT, 1)]
                    self.answered_at.append(time.monotonic())
                except Exception as exc:  # recorded: a request the user saw fail
                    self.refused.append(str(exc)[:200])
                    connection.close()  # this thread's, if it was what broke
                time.sleep(max(0.0, self.every - (time.monotonic() - started)))
        finally:
            connection.close()


def run(
    target: SshTarget,
    *,
    workers: int = 3,
    agents: int = 200,
    requests: int = 8,
    bound: float = 10.0,
) -> DrillResult:
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    values = sentinel_up()
    url, run_dir = (
        values["ACTIVATE_TEST_SENTINEL_URL"],
        Path(values["ACTIVATE_TEST_SENTINEL_RUN_DIR"]),
    )
    try:
        with Drill("redis-failover", target, title=NAME, redis_url=url) as drill:
            client_for(url).flushdb()  # the set's own database: what an earlier run left
            drill.platform.start_all()
            made = drill.request(RUN_ENVIRONMENT, workers)
            if not drill.wait_status(made, {S.CONNECTED}, timeout=180):
                raise HarnessError(f"workers did not connect: {drill.statuses(made)}")
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            interval = drill.knob("ACTIVATE_HEARTBEAT_INTERVAL")
            holder = Worker.objects.get(pk=made[0].pk)
            members = crowd_workers(agents, beside=holder, name="crowd")
            crowd_rows = list(Worker.objects.filter(pk__in=[m.worker_id for m in members]))
            crowd = AgentCrowd(
                members,
                url=drill.platform.agent_url,
                interval=interval,
                job_id=holder.scheduler_job_id,
                hostname=holder.node_hostname,
                workdir=drill.platform.workdir,
            )
            try:
                crowd.start()
                if not drill.wait_status(crowd_rows, {S.CONNECTED}, timeout=180):
                    statuses = Counter(drill.statuses(crowd_rows).values())
                    raise HarnessError(f"the crowd did not connect: {dict(statuses)}")
                pause(3 * interval)  # every agent beating at its own phase
                everyone = made + crowd_rows

                stream = RequestStream(drill, requests, every=1.0)
                stream.start()
                pause(requests / 3)  # a third of the requests before the kill, the rest after
                killed_at = now()
                killed = time.monotonic()
                old_port = kill_master(url, run_dir)
                promoted = wait_for_promotion(url, old_port)
                promoted_epoch = time.time() - (time.monotonic() - promoted)
                watched = heard_after(
                    url, [w.pk for w in everyone], promoted, ttl_ms=int(timeout * 1000),
                    timeout=30,
                )  # fmt: skip
                heard, swept = watched.beats, watched.sweep
                drill.result.repetitions += 1
                stream.join(timeout=requests * 30)
                # Past the heartbeat timeout and a few sweeps: a false stop would show by now.
                pause(max(0.0, timeout + 3 * sweep - (time.monotonic() - promoted)))
                calls = crowd.calls()
                answered = first_accepted(calls, promoted_epoch)

                unanswered = [
                    m.public_id for m in members if answered.get(m.worker_id, bound + 1) > bound
                ]
                drill.check(
                    not unanswered,
                    f"agents with no beat answered within {bound:g} s of promotion: {unanswered}",
                )
                drill.check(
                    swept is not None and swept <= bound,
                    f"no heartbeat sweep completed within {bound:g} s of promotion",
                )
                changes = drill.changes_since(killed_at, everyone)
                drill.check(not changes, f"status changed through the failover: {changes[:10]}")
                # A process that died would also hide a false stop: its sweeps no longer run.
                ended = {
                    n: p.returncode
                    for n, p in drill.platform.processes.items()
                    if p.poll() is not None
                }
                drill.check(not ended, f"platform processes ended through the failover: {ended}")
                died = drill.log_count(CELERY_DIED)
                restarted = drill.log_count(CELERY_RESTARTED)
                drill.check(
                    not died and not restarted,
                    f"Celery processes exited through the failover: {died} unrecoverable errors, "
                    f"{restarted} started again by scripts/start.sh",
                )
                drill.check(not stream.refused, f"requests refused: {stream.refused}")
                requested = list(Worker.objects.filter(pk__in=stream.made))
                connected = drill.wait_status(requested, {S.CONNECTED}, timeout=180)
                drill.check(
                    connected, f"requests made around the kill: {drill.statuses(requested)}"
                )
                arrived = sum(
                    status == S.CONNECTED for status in drill.statuses(requested).values()
                )
                counts = drill.job_counts(requested)
                wrong = {name: n for name, n in counts.items() if n != 1}
                drill.check(not wrong, f"requests not ending in exactly one job: {wrong}")

                refused = sum(
                    1
                    for c in calls
                    if c.path == BEAT_PATH and not c.accepted and killed_at.timestamp() <= c.sent
                )
                drill.note(
                    "; ".join(
                        [
                            f"{workers} real workers and {agents} crowd agents connected, beating "
                            f"every {interval:g} s, {requests} requests 1 s apart around the kill",
                            f"replica promoted {promoted - killed:.1f} s after the SIGKILL",
                            f"each agent's first beat answered after the promotion: "
                            f"{spread(list(answered.values()), agents)}",
                            f"heartbeat keys set again on the new master (beats or grace): "
                            f"{spread(list(heard.values()), len(everyone))}",
                            f"{refused} crowd beats refused or unanswered from the kill on",
                            "heartbeat sweep done again "
                            + ("never" if swept is None else f"{swept:.2f} s after the promotion"),
                            f"{len(changes)} status changes",
                            f"Celery exits {died}, restarts {restarted}",
                            f"{arrived}/{requests} requests connected, jobs per request "
                            f"{sorted(set(counts.values()))}",
                        ]
                    )
                )
                result = drill.result
            finally:
                # While the agents still beat: once silent, the sweep would stop their workers
                # (events written as the rows go). Not left for the clean-up's deletions either:
                # each would cancel a job that is not theirs.
                Worker.objects.filter(pk__in=[w.pk for w in crowd_rows]).delete()
                crowd.stop()
    finally:
        sentinel_up()
    return result

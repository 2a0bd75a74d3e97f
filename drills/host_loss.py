"""A whole host lost: every process of one of two hosts SIGKILLed at once, under load.

Two full process sets ("hosts": web, agents' server, Celery worker, sweeper, beat, relay keeper)
share PostgreSQL and Redis behind HAProxy (harness/balancer.py, shaped as docker/haproxy.cfg):
users and agents are told only the balancer's addresses. Agents of a direct cluster and of a
cluster reached via its login host (a relay) beat through it, spread over both agents' servers.
Each round the host holding the beat lease and the relay is lost while requests for workers
arrive, a kept terminal is open on each host and every agent beats; then it comes back. The
loss comes at a moment when the host's Celery worker holds a submission: its processes are
frozen (SIGSTOP) until one is seen holding a submission's lock (thawed and tried again when
none is), stay frozen FREEZE seconds so that a request the balancer sent it hangs there, and
are then SIGKILLed. Checked each round: a submission was in flight on the lost host and an HTTP
request was in flight to it and cut off (sent before the kill, answered by a 5xx or no answer
after it); every worker requested ends with exactly one job (requests cut off in flight
included: those that made a worker); no worker changes status; the other beat sends
sweeps within a lease; the relay moves to the other host; the lost host's terminal ends for its
client, its record closes with a reason, and it reconnects through the balancer to the other
host, where the kept shell is as it was; the other host's terminal never notices.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from drills.beat_failover import sweeps_sent
from drills.drill import Drill, DrillResult, now, pause, submitting_processes
from harness import HarnessError
from harness.balancer import PIN_HEADER, Backend, Balancer
from harness.cluster import SshTarget
from harness.objects import (
    CLUSTER_NAME,
    HELD_ENVIRONMENT,
    RUN_ENVIRONMENT,
    ensure_environments,
    register_cluster,
)
from harness.platform import Platform
from harness.relays import relay_pids
from harness.waiting import wait_until

if TYPE_CHECKING:
    from workers_app.models import Worker

NAME = "A whole host lost: web, agents, worker, sweeper, beat, relays SIGKILLed at once"
LEASE = 5.0
KNOBS = {
    "ACTIVATE_BEAT_LEASE": f"{LEASE:g}",
    "ACTIVATE_RELAY_LEASE": "2",
    "ACTIVATE_RELAY_CHECK_INTERVAL": "0.5",
    "ACTIVATE_HEARTBEAT_TIMEOUT": "10",
    "ACTIVATE_METRICS_TOKEN": "host-loss-drill-" + "0" * 24,
}
RELAY_CLUSTER = "host-loss-relay"
HOSTS = ("a", "b")
# Requests for workers go out from SENDERS threads, each this often, from before the kill until
# after it: some are in flight on the lost host when it goes.
SENDERS = 2
REQUEST_EVERY = 0.1
REQUESTS_BEFORE, REQUESTS_AFTER = 2.0, 3.0
RETRIES, RETRY_AFTER = 5, 0.5
# How long the lost host's processes may be frozen and thawed in turn, waiting for one to hold a
# submission; and how long they stay frozen before the kill once one does.
FIND_SUBMISSION_WITHIN = 15.0
FREEZE = 0.5


@dataclass
class Attempt:
    sent: float
    answered: float
    status: int  # -1: no answer at all


@dataclass
class Asked:
    """One request for a worker, with its retries (the same Idempotency-Key, as `pw` sends)."""

    sent: float
    answered: float = 0.0
    status: int = 0
    worker: str = ""
    # What the attempts before the last got (-1: no answer at all).
    cut: list[int] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class Requests:
    """POST /api/workers/ through the balancer at a steady pace, in threads; a request cut off
    is sent again with its key until it is answered."""

    url: str
    key: str
    asked: list[Asked] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self, senders: int = SENDERS) -> list[threading.Thread]:
        """``senders`` threads sending requests until ``stop`` is set; they are returned."""
        threads = [threading.Thread(target=self.run, daemon=True) for _ in range(senders)]
        for thread in threads:
            thread.start()
        return threads

    def run(self) -> None:
        with httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        ) as api:
            while not self.stop.is_set():
                asked = Asked(sent=time.time())
                self.asked.append(asked)
                self._ask(api, asked, uuid.uuid4().hex)
                self.stop.wait(REQUEST_EVERY)

    def _ask(self, api: httpx.Client, asked: Asked, key: str) -> None:
        for _ in range(RETRIES):
            sent = time.time()
            try:
                answer = api.post(
                    "/api/workers/",
                    json={"cluster": CLUSTER_NAME, "environment": HELD_ENVIRONMENT},
                    headers={"Idempotency-Key": key},
                )
                status = answer.status_code
            except httpx.HTTPError:
                status = -1
            asked.attempts.append(Attempt(sent, time.time(), status))
            if status in (200, 201):
                asked.status, asked.worker = status, answer.json()["id"]
                break
            asked.cut.append(status)
            time.sleep(RETRY_AFTER)
        asked.answered = time.time()


class Terminal:
    """A kept terminal over the balancer's WebSocket, pinned to one host while it is up. A
    thread reads it, noting its output and when the server side went away."""

    def __init__(self, balancer: Balancer, key: str, worker: Worker, host: str, keep: str) -> None:
        url = balancer.url.replace("http", "ws") + f"/ws/workers/{worker.public_id}/terminal/"
        headers = {"Authorization": f"Bearer {key}", PIN_HEADER: host}
        self.ws: ClientConnection = connect(url, additional_headers=headers, open_timeout=20)
        self.ws.send(
            json.dumps(
                {"type": "start", "command": [], "pty": True, "cols": 100, "rows": 30, "keep": keep}
            )
        )
        started: dict[str, Any] = {}
        while not started:
            frame = self.ws.recv(timeout=30)
            if isinstance(frame, str):
                started = json.loads(frame)
        if started.get("type") != "started":
            raise HarnessError(f"the terminal did not start: {started}")
        self.record = int(started["terminal"])
        self.seen = b""
        self.closed_at: float | None = None
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                frame = self.ws.recv()
                if isinstance(frame, bytes):
                    with self.changed:
                        self.seen += frame[1:]
                        self.changed.notify_all()
        except ConnectionClosed:
            with self.changed:
                self.closed_at = time.time()
                self.changed.notify_all()

    def type_and_wait(self, line: str, wanted: bytes, timeout: float = 30) -> bool:
        """Type ``line`` once the terminal has drawn something, again every few seconds until
        ``wanted`` shows: keys typed while tmux attaches may be taken as its terminal's answers."""
        deadline = time.monotonic() + timeout
        with self.changed:
            self.changed.wait_for(lambda: bool(self.seen), timeout=timeout)
        while time.monotonic() < deadline:
            try:
                self.ws.send(line.encode() + b"\n")
            except ConnectionClosed:
                return False
            if self.wait_for_output(wanted, min(5.0, max(0.0, deadline - time.monotonic()))):
                return True
        return False

    def wait_for_output(self, wanted: bytes, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: wanted in self.seen, timeout=timeout)

    def wait_closed(self, timeout: float) -> float | None:
        """When the server side went away (None: still open after ``timeout``)."""
        with self.changed:
            self.changed.wait_for(lambda: self.closed_at is not None, timeout=timeout)
            return self.closed_at

    def close(self) -> None:
        self.ws.close()


def run(target: SshTarget, *, rounds: int = 3) -> DrillResult:
    try:
        with Drill("host-loss", target, title=NAME, knobs=KNOBS) as drill:
            hosts = _hosts(drill)
            balancer = Balancer(
                drill.platform.workdir,
                [Backend(name, p.port, p.agent_port) for name, p in hosts.items()],
            )
            for platform in hosts.values():
                platform.public_url, platform.agents_url = balancer.url, balancer.agents_url
            try:
                balancer.start()
                _exercise(drill, hosts, balancer, rounds)
            finally:
                # The drill's clean-up deletes workers through host a: it must be up.
                if "web" not in hosts["a"].processes:
                    hosts["a"].start_all()
                hosts["b"].stop_all()
                balancer.stop()
            return drill.result
    finally:
        forget_relay_cluster()


def _hosts(drill: Drill) -> dict[str, Platform]:
    a = drill.platform
    a.relays = True
    workdir = a.workdir / "host-b"
    workdir.mkdir()
    b = Platform(workdir=workdir, knobs=dict(a.knobs), relays=True, web_as_shipped=True)
    return {"a": a, "b": b}


def start_host(platform: Platform) -> None:
    platform.start_web()
    platform.start_agents()
    platform.start_worker()
    platform.start_sweeper()
    platform.start_beat()
    platform.start_relays()


def settle_two_hosts(
    drill: Drill, hosts: dict[str, Platform], balancer: Balancer, *, first: str
) -> tuple[list[Worker], list[Worker], list[Worker]]:
    """Both hosts started, ``first`` first (it takes the beat lease and the relay), and workers
    settled: held ones queued, running ones connected directly and via the login host's relay
    (held, running, the relayed among the running)."""
    from workers_app.models import AgentRoute
    from workers_app.statuses import WorkerStatus

    relay_cluster = register_cluster(drill.target, name=RELAY_CLUSTER)
    relay_cluster.agent_route, relay_cluster.relay_host = AgentRoute.VIA_LOGIN_HOST, "127.0.0.1"
    relay_cluster.save()
    ensure_environments(relay_cluster, drill.target.partition)
    start_host(hosts[first])
    if not wait_until(lambda: holders(hosts)[0] == first, timeout=30):
        raise HarnessError(f"host {first} did not take the beat lease: {holders(hosts)}")
    for name, platform in hosts.items():
        if name != first:
            start_host(platform)
    held, direct = drill.settled(queued=1, connected=2)
    relayed = request_workers(balancer, drill.key, RELAY_CLUSTER, RUN_ENVIRONMENT, 2)
    if not drill.wait_status(relayed, {WorkerStatus.CONNECTED}, timeout=180):
        raise HarnessError(f"relayed workers did not connect: {drill.statuses(relayed)}")
    return held, direct + relayed, relayed


def _exercise(drill: Drill, hosts: dict[str, Platform], balancer: Balancer, rounds: int) -> None:
    from workers_app.models import Worker

    # Host a first, so the first host lost holds the beat lease and the relay.
    held, running, relayed = settle_two_hosts(drill, hosts, balancer, first="a")
    drill.check(
        wait_until(lambda: all(n > 0 for n in beats_by_host(hosts).values()), timeout=30),
        f"agents' beats did not reach both hosts: {beats_by_host(hosts)}",
    )
    figures: list[str] = []
    victim = holders(hosts)[0] or "a"
    for number in range(rounds):
        survivor = next(name for name in HOSTS if name != victim)
        # The host lost last round is back only once HAProxy's checks pass: until then its pinned
        # terminal would land on the other host, and every request too.
        waited = time.monotonic()
        balancer.wait_all_up()
        waited = time.monotonic() - waited
        line = _lose(drill, hosts, balancer, victim, survivor, running, number)
        figures.append(
            f"round {number + 1} (host {victim} lost, after {waited:.1f} s waiting for HAProxy "
            f"to hold every server up): {line}"
        )
        drill.result.repetitions += 1
        victim = survivor
    every = Worker.objects.filter(owner=drill.owner)
    answered = beats_by_host(hosts)
    drill.note(
        f"{len(held) + len(running)} workers settled ({len(relayed)} via the login host's "
        f"relay), beats spread over both agents' servers; "
        + "; ".join(figures)
        + f"; {every.count()} workers in all; beats answered by each host's agents' server "
        + ", ".join(f"{name} {count}" for name, count in answered.items())
    )


def _lose(
    drill: Drill,
    hosts: dict[str, Platform],
    balancer: Balancer,
    victim: str,
    survivor: str,
    running: list[Worker],
    number: int,
) -> str:
    from workers_app.models import AgentRelay, TerminalRecord, Worker
    from workers_app.statuses import WorkerStatus
    from workers_app.terminals.service import LOST_REASON

    beat_holder, relay_holder = holders(hosts)
    drill.check(beat_holder == victim, f"round {number + 1}: beat lease on {beat_holder}")
    drill.check(relay_holder == victim, f"round {number + 1}: relay on {relay_holder}")
    terminals = {
        name: Terminal(balancer, drill.key, running[0], name, f"drill-{number}-{name}")
        for name in HOSTS
    }
    for name, terminal in terminals.items():
        if not terminal.type_and_wait(f"echo mark-$((40+2))-{name}", f"mark-42-{name}".encode()):
            raise HarnessError(f"the terminal on host {name} did not answer")
    records = {n: TerminalRecord.objects.get(pk=t.record) for n, t in terminals.items()}
    began = now()
    before = set(Worker.objects.filter(owner=drill.owner).values_list("pk", flat=True))
    requests = Requests(balancer.url, drill.key)
    senders = requests.start()
    pause(REQUESTS_BEFORE)
    frozen_at, submitting = freeze_while_submitting(hosts[victim])
    drill.check(
        bool(submitting),
        f"round {number + 1}: no submission in flight on host {victim}'s Celery worker within "
        f"{FIND_SUBMISSION_WITHIN:g} s",
    )
    pause(FREEZE)
    killed_at = time.time()
    lost = hosts[victim].kill_all()
    pause(REQUESTS_AFTER)
    requests.stop.set()
    for sender in senders:
        sender.join(timeout=60)

    cut_at = terminals[victim].wait_closed(15)
    cut = None if cut_at is None else cut_at - killed_at
    drill.check(cut is not None, f"round {number + 1}: the lost host's terminal stayed open")
    again = Terminal(balancer, drill.key, running[0], victim, f"drill-{number}-{victim}")
    # tmux redraws the kept shell's screen on attach: the earlier line is there.
    redrawn = again.wait_for_output(f"mark-42-{victim}".encode(), 20)
    drill.check(redrawn, f"round {number + 1}: the kept terminal came back without its screen")
    drill.check(
        again.type_and_wait("echo again-$((2+3))", b"again-5"),
        f"round {number + 1}: the reconnected terminal did not answer",
    )
    drill.check(
        terminals[survivor].type_and_wait("echo still-$((3+4))", b"still-7"),
        f"round {number + 1}: the surviving host's terminal did not answer",
    )
    record_closed = wait_until(
        lambda: TerminalRecord.objects.filter(
            pk=records[victim].pk, close_reason=LOST_REASON
        ).exists(),
        timeout=30,
    )
    closed_at = TerminalRecord.objects.get(pk=records[victim].pk).closed_at
    closed_after = closed_at.timestamp() - killed_at if closed_at else None
    drill.check(
        record_closed, f"round {number + 1}: the lost terminal's record was not closed as lost"
    )
    drill.check(
        TerminalRecord.objects.filter(pk=records[survivor].pk, closed_at__isnull=True).exists(),
        f"round {number + 1}: the surviving host's terminal record was closed",
    )
    for terminal in (again, terminals[survivor]):
        terminal.close()

    sends = [t for t, _ in sweeps_sent(hosts[survivor].workdir / "beat.log", after=killed_at)]
    took_over = sends[0] - killed_at if sends else None
    drill.check(
        took_over is not None and took_over < LEASE,
        f"round {number + 1}: host {survivor}'s beat sent its first sweep after "
        f"{took_over if took_over is None else round(took_over, 1)} s (limit {LEASE:g} s)",
    )
    relay_moved = wait_until(lambda: holders(hosts)[1] == survivor, timeout=30)
    drill.check(relay_moved, f"round {number + 1}: the relay did not move to host {survivor}")
    relay = AgentRelay.objects.filter(cluster__name=RELAY_CLUSTER).first()
    moved_after = (
        relay.up_since.timestamp() - killed_at if relay_moved and relay and relay.up_since else None
    )

    made = Worker.objects.filter(owner=drill.owner).exclude(pk__in=before)
    unanswered = [a for a in requests.asked if not a.worker]
    drill.check(
        not unanswered,
        f"round {number + 1}: requests never answered with their worker: "
        f"{[a.cut for a in unanswered]}",
    )
    asked_for = {a.worker for a in requests.asked if a.worker}
    drill.check(
        asked_for == set(made.values_list("public_id", flat=True))
        and len(asked_for) == len(requests.asked) - len(unanswered),
        f"round {number + 1}: {len(requests.asked)} requests, {len(asked_for)} workers named in "
        f"the answers, {made.count()} made",
    )
    queued = drill.wait_status(list(made), {WorkerStatus.QUEUED}, timeout=90)
    counts = drill.job_counts(made)
    wrong = {name: n for name, n in counts.items() if n != 1}
    drill.check(
        queued and not wrong,
        f"round {number + 1}: jobs per worker requested across the loss: {wrong} "
        f"({drill.statuses(made)})",
    )
    changes = drill.changes_since(began, running)
    drill.check(not changes, f"round {number + 1}: status changed across the loss: {changes}")

    cut_off = [status for a in requests.asked for status in a.cut]
    retried = [a for a in requests.asked if a.cut]
    in_flight = [a for a in requests.asked if a.sent <= killed_at <= a.answered]
    # Sent before the kill, answered after it by a 5xx or no answer: cut off on the lost host.
    cut_in_flight = [
        t
        for a in requests.asked
        for t in a.attempts
        if t.sent < killed_at < t.answered and (t.status < 0 or t.status >= 500)
    ]
    drill.check(
        bool(cut_in_flight),
        f"round {number + 1}: no request in flight to host {victim} was cut off by its loss "
        f"({len(in_flight)} requests in flight at the kill)",
    )
    drill.check(
        set(submitting) <= set(made.values_list("pk", flat=True)),
        f"round {number + 1}: a submission in flight on host {victim} was not of a worker "
        "requested this round",
    )
    start_host(hosts[victim])
    return (
        f"{len(lost)} processes killed, {killed_at - frozen_at:.1f} s after they were frozen "
        f"with the submissions of {len(submitting)} workers in flight; {len(requests.asked)} "
        f"requests, {len(in_flight)} in flight at the kill ({len(cut_in_flight)} of them cut "
        f"off by it), {len(retried)} cut off and sent again with their key "
        f"({_statuses(cut_off)}), each answered with its worker; {made.count()} workers made, "
        f"each with one job; beat on {survivor} sending after "
        f"{'-' if took_over is None else f'{took_over:.1f}'} s, relay up on {survivor} after "
        f"{'-' if moved_after is None else f'{moved_after:.1f}'} s; the lost terminal cut after "
        f"{'-' if cut is None else f'{cut:.1f}'} s, its record closed "
        f"{'-' if closed_after is None else f'{closed_after:.1f}'} s after the kill, "
        f"reattached on {survivor} with its screen"
    )


def freeze_while_submitting(platform: Platform) -> tuple[float, set[int]]:
    """Freeze every process of the host (SIGSTOP) at a moment when its Celery worker holds a
    submission's lock: when and the workers whose submission it holds (empty: none was seen
    within FIND_SUBMISSION_WITHIN; the processes are left frozen either way)."""
    groups = [p.pid for p in platform.processes.values() if p.poll() is None]
    worker = platform.processes["worker"]
    deadline = time.monotonic() + FIND_SUBMISSION_WITHIN
    while True:
        for group in groups:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
        frozen_at = time.time()
        holders = submitting_processes([worker.pid, *platform.child_pids("worker")])
        if holders or time.monotonic() >= deadline:
            return frozen_at, set(holders)
        for group in groups:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
        pause(0.02)


def _statuses(statuses: list[int]) -> str:
    found: dict[int, int] = {}
    for status in statuses:
        found[status] = found.get(status, 0) + 1
    return ", ".join(f"{n} x {s if s > 0 else 'no answer'}" for s, n in sorted(found.items()))


def request_workers(
    balancer: Balancer, key: str, cluster: str, environment: str, count: int
) -> list[Worker]:
    from workers_app.models import Worker

    ids = []
    with httpx.Client(
        base_url=balancer.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        for _ in range(count):
            answer = api.post(
                "/api/workers/", json={"cluster": cluster, "environment": environment}
            )
            if answer.status_code != 201:
                raise HarnessError(f"POST /api/workers/ answered {answer.status_code}")
            ids.append(answer.json()["id"])
    return list(Worker.objects.filter(public_id__in=ids))


def holders(hosts: dict[str, Platform]) -> tuple[str | None, str | None]:
    """Which host's beat holds the beat lease, and which host's relay keeper the relay."""
    from core.beat import lease_key
    from workers_app.models import AgentRelay

    def host_of(process: str, token: Any) -> str | None:
        if isinstance(token, bytes):
            token = token.decode()
        if not token:
            return None
        pid = int(str(token).split(":")[1])
        for name, platform in hosts.items():
            started = platform.processes.get(process)
            if started is not None and started.pid == pid:
                return name
        return None

    relay = AgentRelay.objects.filter(cluster__name=RELAY_CLUSTER, state="up").first()
    client = hosts["a"].redis_client()
    return host_of("beat", client.get(lease_key())), host_of(
        "relays", relay.holder if relay else None
    )


def beats_by_host(hosts: dict[str, Platform]) -> dict[str, int]:
    """Heartbeats each host's agents' server answered, from its own /metrics."""
    counts = {}
    for name, platform in hosts.items():
        text = httpx.get(
            f"{platform.url}/metrics",
            headers={"Authorization": f"Bearer {KNOBS['ACTIVATE_METRICS_TOKEN']}"},
            timeout=10,
        ).text
        counts[name] = int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("activate_heartbeats_received_total")
            )
        )
    return counts


def forget_relay_cluster(name: str = RELAY_CLUSTER) -> None:
    """The cluster and its relays on the login host gone."""
    from workers_app.models import Cluster
    from workers_app.relays import relay_tag

    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        return
    for pid in relay_pids(relay_tag(cluster)):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster.delete()

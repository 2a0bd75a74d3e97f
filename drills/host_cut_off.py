"""A host cut off, not killed: one of two hosts runs in a network namespace whose link is dropped
(harness/netns.py), its processes running on and every connection of theirs left open, silent,
on the other side.

Two full process sets share PostgreSQL and Redis behind HAProxy, as in drills/host_loss.py; host
b runs in the namespace, with the same settings (inside it, 127.0.0.1's service ports lead over
the link). Each round host b holds the beat lease and the relay of a cluster whose agents go via
the login host, requests for workers flow through the balancer, and b is frozen for an instant
at a moment when its Celery worker holds a submission's lock, its link dropped, and it is thawed
cut off. Two rounds:

- short: the link is back after SHORT_CUT, within the peer silence (ACTIVATE_PEER_SILENCE), so
  b's connections were never given up: host a took the beat lease and the relay meanwhile, and
  what b then does late is refused by its fence (the beat's tasks at their entry, the relay's
  row and lease); b's submission, whose lock stood throughout, finishes: one job.
- long: the link stays down LONG_CUT, past the silence: PostgreSQL gives up b's sessions and
  their locks, and host a sweeps, keeps the relay and submits what b had locked within the
  bound stated below; when the link returns b's connections are dead and nothing of b's lands.

Checked each round: within the bounds a's beat sends sweeps and a's keeper holds the relay; no
two beats send the same sweep within a sweep interval (drills/beat_failover.py); every sweep b's
beat sent after the cut that reached the broker was refused by its fence or dropped as expired;
b's relay keeper gives up the relay (its lease or its row refused) and the login host runs one
relay; every worker requested
across the cut ends queued with exactly one job; no running worker changes status.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from django.conf import settings

from drills.beat_failover import sweep_overlaps, sweeps_sent
from drills.drill import Drill, DrillResult, now, pause
from drills.host_loss import (
    KNOBS as HOST_LOSS_KNOBS,
)
from drills.host_loss import (
    RELAY_CLUSTER,
    Requests,
    forget_relay_cluster,
    freeze_while_submitting,
    holders,
    settle_two_hosts,
)
from harness import HarnessError
from harness.balancer import Backend, Balancer
from harness.cluster import SshTarget
from harness.netns import CutOffHost, cut_off_host
from harness.platform import Platform
from harness.relays import relay_pids
from harness.waiting import wait_until

if TYPE_CHECKING:
    from workers_app.models import Worker

NAME = "A host cut off by the network, not killed: the other takes over, its late acts refused"
BEAT_LEASE = 5.0
RELAY_LEASE = 2.0
SWEEP = 1.0
SILENCE = 15.0
SUBMIT_LEASE = 8.0
KNOBS = {
    **HOST_LOSS_KNOBS,
    "ACTIVATE_BEAT_LEASE": f"{BEAT_LEASE:g}",
    "ACTIVATE_RELAY_LEASE": f"{RELAY_LEASE:g}",
    "ACTIVATE_PEER_SILENCE": f"{SILENCE:g}",
    "ACTIVATE_SUBMIT_LEASE": f"{SUBMIT_LEASE:g}",
    # Agents whose kept connection went to the cut-off host wait out their call and HAProxy's
    # checks (down after two failures 5 s apart) before their beats reach the other.
    "ACTIVATE_HEARTBEAT_TIMEOUT": "30",
}
# The bounds, from the cut: a's first sweep within a beat lease and a sweep; the relay on a
# within a relay lease, a check and its set-up over SSH; what b had locked within the silence
# (the lock's lease: PostgreSQL then gives b's session up), two sweeps (the dispatch sweep
# leaves a locked worker out) and a submission.
BEAT_BOUND = BEAT_LEASE + SWEEP
RELAY_BOUND = RELAY_LEASE + 8.0
SUBMIT_BOUND = SILENCE + 2 * SWEEP + 4.0
SHORT_CUT = 10.0
LONG_CUT = SUBMIT_BOUND + 10.0
# After the link is back: how long b's late acts are watched.
AFTER = 3 * BEAT_LEASE
REQUESTS_BEFORE, REQUESTS_AFTER = 2.0, 3.0
_EXPIRED = "Discarding revoked task: workers_app.tasks.sweep"


def run(target: SshTarget) -> DrillResult:
    try:
        with Drill("host-cut-off", target, title=NAME, knobs=KNOBS) as drill:
            a = drill.platform
            a.relays = True
            balancer = Balancer(a.workdir, [Backend("a", a.port, a.agent_port)])
            database = settings.DATABASES["default"]
            ports = [int(database["PORT"] or 5432), _redis_port(), target.port]
            with cut_off_host([*ports, balancer.web_port, balancer.agents_port]) as link:
                b = _host_b(a, link)
                balancer.backends.append(Backend("b", b.port, b.agent_port, host=link.inner))
                hosts = {"a": a, "b": b}
                for platform in hosts.values():
                    platform.public_url, platform.agents_url = balancer.url, balancer.agents_url
                try:
                    balancer.start()
                    _exercise(drill, hosts, balancer, link)
                finally:
                    link.restore()
                    b.stop_all()
                    if "web" not in a.processes:
                        a.start_all()
                    balancer.stop()
            return drill.result
    finally:
        forget_relay_cluster()


def _redis_port() -> int:
    return urlparse(settings.REDIS_URL).port or 6379


def _host_b(a: Platform, link: CutOffHost) -> Platform:
    workdir = a.workdir / "host-b"
    workdir.mkdir()
    return Platform(
        workdir=workdir,
        knobs=dict(a.knobs),
        relays=True,
        web_as_shipped=True,
        web_host=link.inner,
        agent_host=link.inner,
        wrap=link.argv([]),
    )


def _exercise(
    drill: Drill, hosts: dict[str, Platform], balancer: Balancer, link: CutOffHost
) -> None:
    from workers_app.models import Worker

    # Host b first: the host cut off holds the beat lease and the relay.
    held, running, relayed = settle_two_hosts(drill, hosts, balancer, first="b")
    lines = []
    for label, down in (("short", SHORT_CUT), ("long", LONG_CUT)):
        if holders(hosts) != ("b", "b"):
            _hand_to_b(hosts)
        lines.append(
            f"{label} cut ({down:g} s): " + _cut(drill, hosts, balancer, link, down, running)
        )
        drill.result.repetitions += 1
    drill.note(
        f"{len(held) + len(running)} workers settled ({len(relayed)} via the login host's relay); "
        f"peer silence {SILENCE:g} s, beat lease {BEAT_LEASE:g} s, relay lease {RELAY_LEASE:g} s, "
        f"submit lease {SUBMIT_LEASE:g} s; "
        + "; ".join(lines)
        + f"; {Worker.objects.filter(owner=drill.owner).count()} workers in all"
    )


def _hand_to_b(hosts: dict[str, Platform]) -> None:
    """The beat lease and the relay back on host b: a's beat and keeper stopped until b holds
    both, then started again (standing by)."""
    a = hosts["a"]
    a.stop("beat")
    a.stop("relays")
    held = wait_until(lambda: holders(hosts) == ("b", "b"), timeout=60)
    log = a.workdir / "beat.log"
    since = log.stat().st_size
    a.start_beat()
    a.start_relays()
    if not held:
        raise HarnessError(f"host b did not take the beat lease and the relay: {holders(hosts)}")
    # Started, a's beat stands by (its first tick found b holding) before b is cut.
    if not wait_until(lambda: b"standing by" in log.read_bytes()[since:], timeout=60):
        raise HarnessError("host a's beat did not start standing by")


def _cut(
    drill: Drill,
    hosts: dict[str, Platform],
    balancer: Balancer,
    link: CutOffHost,
    down: float,
    running: list[Worker],
) -> str:
    from core import lease as leases
    from core.beat import lease_key
    from workers_app.models import AgentRelay, Worker
    from workers_app.relays import relay_tag
    from workers_app.statuses import WorkerStatus

    a, b = hosts["a"], hosts["b"]
    client = a.redis_client()
    refused_before = leases.refused(client, lease_key())
    began = now()
    before = set(Worker.objects.filter(owner=drill.owner).values_list("pk", flat=True))
    requests = Requests(balancer.url, drill.key)
    senders = requests.start()
    pause(REQUESTS_BEFORE)
    frozen_at, locked = freeze_while_submitting(b)
    link.cut()
    cut_at = time.time()
    _thaw(b)
    try:
        drill.check(bool(locked), f"no submission in flight on host b at the {down:g} s cut")
        pause(REQUESTS_AFTER)
        requests.stop.set()
        beat_on_a = wait_until(lambda: holders(hosts)[0] == "a", timeout=BEAT_BOUND + 5)
        relay_on_a = wait_until(lambda: holders(hosts)[1] == "a", timeout=RELAY_BOUND + 5)
        submitted = {}
        if down > SILENCE and locked:
            queued = wait_until(
                lambda: _queued_at(locked) is not None, timeout=SUBMIT_BOUND + 5, interval=0.2
            )
            at = _queued_at(locked)
            drill.check(
                queued and at is not None and at - cut_at < SUBMIT_BOUND,
                f"what b had locked was queued after {_s(at - cut_at if at else None)} (bound "
                f"{SUBMIT_BOUND:g} s): {drill.statuses(_w(locked))}",
            )
            submitted = {"at": at}
        else:
            drill.check(
                not Worker.objects.filter(pk__in=locked, status=WorkerStatus.QUEUED).exists(),
                "a worker b held the lock of was queued while b's lock stood",
            )
        pause(max(0.0, cut_at + down - time.time()))
    finally:
        link.restore()
    restored_at = time.time()
    for sender in senders:
        sender.join(timeout=90)
    pause(AFTER)

    sends = sweeps_sent(a.workdir / "beat.log", after=cut_at)
    took_over = sends[0][0] - cut_at if sends else None
    drill.check(
        beat_on_a and took_over is not None and took_over < BEAT_BOUND,
        f"host a's beat sent its first sweep after {_s(took_over)} (bound {BEAT_BOUND:g} s)",
    )
    drill.check(
        holders(hosts)[0] == "a",
        f"the beat lease left host a after the link came back: {holders(hosts)}",
    )
    late = sweeps_sent(b.workdir / "beat.log", after=cut_at)
    failed = _log_count(b.workdir / "beat.log", "Couldn't apply scheduled task", after=cut_at)
    refused = leases.refused(client, lease_key()) - refused_before
    # A sweep lands only within its expiry (one interval): one that b sent into its cut
    # connection and that arrived with the link is dropped unrun as expired; within the
    # expiry, the fence refuses it.
    expired = sum(
        _log_count(host.workdir / f"{name}.log", _EXPIRED, after=cut_at)
        for host in hosts.values()
        for name in ("worker", "sweeper")
    )
    drill.check(
        refused + expired >= len(late) - failed,
        f"host b's beat sent {len(late)} sweeps after the cut ({failed} failed to send), "
        f"{refused} refused by their fence, {expired} dropped as expired",
    )
    twice = sweep_overlaps({"a": sends, "b": late}, SWEEP)
    drill.check(not twice, f"both beats sent a sweep at once: {twice[:3]}")

    relay = AgentRelay.objects.filter(cluster__name=RELAY_CLUSTER).first()
    moved = (
        relay.up_since.timestamp() - cut_at
        if relay_on_a and relay is not None and relay.up_since
        else None
    )
    drill.check(
        moved is not None and moved < RELAY_BOUND,
        f"the relay was up on host a after {_s(moved)} (bound {RELAY_BOUND:g} s)",
    )
    drill.check(holders(hosts)[1] == "a", f"the relay left host a: {holders(hosts)}")
    gave_up = _log_count(b.workdir / "relays.log", "lease lost", after=cut_at) + _log_count(
        b.workdir / "relays.log", "row is a later holding's", after=cut_at
    )
    drill.check(gave_up > 0, "host b's relay keeper did not give the relay up")
    relays = relay_pids(relay_tag(relay.cluster)) if relay is not None else []
    drill.check(len(relays) == 1, f"the login host runs {len(relays)} relays of the cluster")

    made = Worker.objects.filter(owner=drill.owner).exclude(pk__in=before)
    drill.check(
        all(asked.worker for asked in requests.asked),
        f"requests never answered: {[asked.cut for asked in requests.asked if not asked.worker]}",
    )
    queued = drill.wait_status(list(made), {WorkerStatus.QUEUED}, timeout=90)
    wrong = {name: n for name, n in drill.job_counts(made).items() if n != 1}
    drill.check(
        queued and not wrong,
        f"jobs per worker requested across the cut: {wrong} ({drill.statuses(made)})",
    )
    changes = drill.changes_since(began, running)
    drill.check(not changes, f"status changed across the cut: {changes}")
    locked_at = submitted.get("at")
    resubmitted = _s(locked_at - cut_at if locked_at else None)
    return (
        f"b frozen {cut_at - frozen_at:.2f} s before the cut with {len(locked)} submission(s) "
        f"locked; a's beat sending after {_s(took_over)}, the relay up on a after {_s(moved)}"
        + (
            f", b's locked workers queued by a after {resubmitted}"
            if down > SILENCE and locked
            else ", b's locked workers left to b (its lock stood) and queued once the link was back"
        )
        + f"; after the link came back: b's beat sent {len(late)} sweeps ({failed} failed to "
        f"send), {refused} refused by their fence, {expired} dropped as expired; b's keeper "
        f"gave the relay up ({gave_up} refusal(s) logged); {len(requests.asked)} requests, "
        f"{made.count()} workers made, each with one job; {restored_at - cut_at:.1f} s down"
    )


def _thaw(platform: Platform) -> None:
    for process in platform.processes.values():
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)


def _w(ids: set[int]) -> list[Worker]:
    from workers_app.models import Worker

    return list(Worker.objects.filter(pk__in=ids))


def _queued_at(ids: set[int]) -> float | None:
    """When the last of these workers was recorded queued (None: not all are)."""
    from django.db.models import Max

    from workers_app.models import WorkerEvent
    from workers_app.statuses import WorkerStatus

    events = WorkerEvent.objects.filter(worker__in=ids, new_status=WorkerStatus.QUEUED)
    if events.values("worker").distinct().count() < len(ids):
        return None
    last = events.aggregate(last=Max("at"))["last"]
    return last.timestamp() if last else None


def _log_count(path: Path, text: str, *, after: float) -> int:
    """Lines of a process's log holding ``text``, stamped after ``after`` (the platform's
    ``YYYY-mm-dd HH:MM:SS,mmm`` or Celery's, the same in brackets)."""
    count = 0
    with suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if text not in line:
                continue
            with suppress(ValueError):
                if (
                    datetime.strptime(line.lstrip("[")[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    > after
                ):
                    count += 1
    return count


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"

"""The beat holder, the relay keeper and a Celery worker mid-submission paused (SIGSTOP) for
twice their lease, then continued (SIGCONT): the other takes over meanwhile, and what the paused
one does once continued is refused by its fence (core/lease.py), or, for the submission, the
other never submits while the paused one's lock (a PostgreSQL session advisory lock, which a
stopped process's kernel keeps alive) stands: exactly one job.

Two beats (a 5 s lease, sweeps every second) and two `run_relays` (a 2 s lease) run beside
workers queued and connected, and a cluster whose agents go via the login host. Each round
pauses the beat holding the lease for two leases, continues it, and counts the workers_app
sweeps it sent after losing the lease against those the sweeper refused (every one must be);
then pauses the relay keeper for two leases, waits for the other to keep the relay, continues
it, and watches for three leases that the successor keeps its lease (the same fence), its row
and its single relay on the login host. No status may change meanwhile. Then, with a second
Celery worker running, it requests held workers, stops the whole Celery worker whose process
holds one's submission lock (its agent secret committed, no job recorded: sbatch under way) for
two submit leases, and checks that meanwhile the lock stays its and no second job appears under
the worker's name, and that once continued every requested worker ends queued with one job.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from drills.drill import (
    Drill,
    DrillResult,
    mid_submission,
    now,
    pause,
    submitting_processes,
)
from drills.host_loss import forget_relay_cluster
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, ensure_environments, job_name, register_cluster
from harness.platform import Platform
from harness.relays import relay_pids
from harness.waiting import wait_for, wait_until

if TYPE_CHECKING:
    from workers_app.models import Cluster

NAME = "Beat holder and relay keeper paused past their lease"
BEAT_LEASE = 5.0
RELAY_LEASE = 2.0
KNOBS = {
    "ACTIVATE_BEAT_LEASE": f"{BEAT_LEASE:g}",
    "ACTIVATE_RELAY_LEASE": f"{RELAY_LEASE:g}",
    "ACTIVATE_RELAY_CHECK_INTERVAL": "0.5",
}
BEATS = ("beat-a", "beat-b")
RELAYS = ("relays-a", "relays-b")
CELERY_WORKERS = ("worker", "worker-b")
RELAY_CLUSTER = "paused-holder-relay"
SENT = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/\w+\] "
    r"Scheduler: Sending due task ([\w-]+) ",
    re.MULTILINE,
)


def run(target: SshTarget, *, rounds: int = 2) -> DrillResult:
    try:
        with Drill("paused-holder", target, title=NAME, knobs=KNOBS) as drill:
            platform = drill.platform
            cluster = _relay_cluster(drill)
            platform.start_web()
            platform.start_agents()
            for name in CELERY_WORKERS:
                platform.start_worker(name)
            platform.start_sweeper()
            for name in BEATS:
                platform.start_beat(name)
            for name in RELAYS:
                platform.start_relays(name)
            held, running = drill.settled(queued=1, connected=2)
            began = now()
            beats: list[str] = []
            relays: list[str] = []
            for _ in range(rounds):
                beats.append(_pause_beat(drill))
                relays.append(_pause_relay(drill, cluster))
            changes = drill.changes_since(began, held + running)
            drill.check(not changes, f"status changed across a pause: {changes}")
            submissions = [_pause_submitter(drill) for _ in range(rounds)]
            drill.result.repetitions = rounds
            lease = drill.knob("ACTIVATE_SUBMIT_LEASE")
            drill.note(
                f"beat lease {BEAT_LEASE:g} s, holder paused {2 * BEAT_LEASE:g} s: "
                + "; ".join(beats)
                + f". Relay lease {RELAY_LEASE:g} s, keeper paused {2 * RELAY_LEASE:g} s: "
                + "; ".join(relays)
                + ". No status change. "
                + f"Submit lease {lease:g} s, Celery worker paused mid-submission "
                + f"{2 * lease:g} s: "
                + "; ".join(submissions)
            )
            return drill.result
    finally:
        forget_relay_cluster(RELAY_CLUSTER)


def _relay_cluster(drill: Drill) -> Cluster:
    from workers_app.models import AgentRoute

    cluster = register_cluster(drill.target, name=RELAY_CLUSTER)
    cluster.agent_route, cluster.relay_host = AgentRoute.VIA_LOGIN_HOST, "127.0.0.1"
    cluster.save()
    ensure_environments(cluster, drill.target.partition)
    return cluster


def _named(platform: Platform, names: tuple[str, ...], value: object) -> str | None:
    """Which of ``names`` a lease value or relay holder names (host:pid...)."""
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str) or value.count(":") < 1:
        return None
    pid = int(value.split(":")[1].split("#")[0])
    for name in names:
        process = platform.processes.get(name)
        if process is not None and process.pid == pid:
            return name
    return None


def _pause_beat(drill: Drill) -> str:
    """Pause the beat holder for two leases and continue it: what it then sent is refused."""
    from django.conf import settings

    from core import lease as leases
    from core.beat import lease_key

    platform = drill.platform
    client = platform.redis_client()
    key = lease_key()
    try:
        holder = wait_for(
            lambda: _named(platform, BEATS, client.get(key)) or "", timeout=2 * BEAT_LEASE
        )
    except TimeoutError:
        raise HarnessError(f"no beat holds the lease: {client.get(key)!r}") from None
    other = next(name for name in BEATS if name != holder)
    fenced = {
        name
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if str(entry["task"]).startswith("workers_app.tasks.")
    }
    refused_before = leases.refused(client, key)
    pid = platform.processes[holder].pid
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        pause(2 * BEAT_LEASE)
        drill.check(
            _named(platform, BEATS, client.get(key)) == other,
            f"{other} did not take the beat lease while {holder} was paused",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    pause(2 * BEAT_LEASE)
    stale = [entry for _, entry in _sent(platform.workdir / f"{holder}.log", after=stopped_at)]
    stale_fenced = [entry for entry in stale if entry in fenced]
    refused = leases.refused(client, key) - refused_before
    # A pause seldom lands between the holder's renewal and its send, so stale sends are rare
    # here; tests/foundation/test_beat_fencing.py pauses a beat exactly there.
    drill.check(
        refused >= len(stale_fenced),
        f"{holder} sent {len(stale_fenced)} sweeps after losing the lease, {refused} refused",
    )
    took = _sent(platform.workdir / f"{other}.log", after=stopped_at)
    return (
        f"{other} sent its first after {took[0][0] - stopped_at:.1f} s, " if took else ""
    ) + f"{holder} sent {len(stale)} after it ({len(stale_fenced)} fenced), {refused} refused"


def _pause_relay(drill: Drill, cluster: Cluster) -> str:
    """Pause the relay keeper for two leases and continue it: it leaves its successor alone."""
    from agents.relays.lease import Lease
    from workers_app.models import AgentRelay, RelayState
    from workers_app.relays import relay_tag

    platform = drill.platform
    client = platform.redis_client()
    key = Lease(cluster.pk).key
    tag = relay_tag(cluster)

    def keeper() -> str | None:
        row = AgentRelay.objects.filter(cluster=cluster, state=RelayState.UP).first()
        return _named(platform, RELAYS, row.holder) if row is not None else None

    try:
        holder = wait_for(lambda: keeper() or "", timeout=60)
    except TimeoutError:
        raise HarnessError(f"no relay up for {cluster.name}\n{platform.logs()}") from None
    other = next(name for name in RELAYS if name != holder)
    pid = platform.processes[holder].pid
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        took_over = wait_until(lambda: keeper() == other, timeout=2 * RELAY_LEASE, interval=0.05)
        took = time.monotonic() - stopped_at
        pause(max(0.0, 2 * RELAY_LEASE - took))
        if not took_over:
            took_over = wait_until(lambda: keeper() == other, timeout=30, interval=0.05)
            took = time.monotonic() - stopped_at
        taken = client.get(key)
        kept = relay_pids(tag)
    finally:
        os.kill(pid, signal.SIGCONT)
    if not drill.check(took_over, f"{other} did not keep the relay while {holder} was paused"):
        return f"{other} did not take over"
    drill.check(len(kept) == 1, f"relays on the login host while {holder} was paused: {kept}")
    problems = _watch(client, key, taken, keeper, other, tag, kept)
    drill.check(not problems, f"after {holder} continued: {problems[:5]}")
    return f"{other} kept the relay {took:.1f} s after the pause; {holder} continued: " + (
        "; ".join(problems[:3]) or "left it alone"
    )


def _pause_submitter(drill: Drill, *, burst: int = 3, tries: int = 5) -> str:
    """Stop the Celery worker holding a submission's lock for two submit leases, then continue
    it: meanwhile the other worker and the dispatch sweep make no second job; then each
    requested worker is queued with exactly one."""
    from workers_app.models import Worker, WorkerEvent
    from workers_app.statuses import WorkerStatus

    platform = drill.platform
    lease = drill.knob("ACTIVATE_SUBMIT_LEASE")
    made: list[Worker] = []
    caught = None
    for _ in range(tries):
        batch = drill.request(HELD_ENVIRONMENT, burst)
        made += batch
        caught, stopped = _stop_a_submitter(platform, {w.pk for w in batch})
        if caught is not None:
            break
    if caught is None:
        raise HarnessError(f"no submission was caught under way in {tries} tries")
    worker_id, name = caught
    group = platform.processes[name].pid
    worker = Worker.objects.get(pk=worker_id)
    most = 0
    lock_kept = True
    try:
        while time.monotonic() - stopped < 2 * lease:
            most = max(most, len(drill.job_ids(worker)))
            lock_kept &= worker_id in submitting_processes(platform.child_pids(name))
            time.sleep(0.5)
        made_while_paused = bool(drill.job_ids(worker))
    finally:
        os.killpg(group, signal.SIGCONT)
        paused_for = time.monotonic() - stopped
    drill.check(most <= 1, f"{worker.public_id} had {most} jobs while its submitter was paused")
    drill.check(lock_kept, f"{worker.public_id}'s submission lock left the paused {name}")
    settle = drill.knob("ACTIVATE_TASK_VISIBILITY_TIMEOUT") + 60
    continued = time.monotonic()
    settled = drill.wait_status(made, {WorkerStatus.QUEUED}, timeout=settle)
    took = time.monotonic() - continued
    drill.check(settled, f"not all queued {settle:g} s after SIGCONT: {drill.statuses(made)}")
    counts = drill.job_counts(made)
    drill.check(all(n == 1 for n in counts.values()), f"jobs per worker: {counts}")
    worker.refresh_from_db()
    listed = drill.job_ids(worker)
    drill.check(
        listed == [worker.scheduler_job_id],
        f"{job_name(worker.public_id)} records {worker.scheduler_job_id!r}, squeue has {listed}",
    )
    adopted = WorkerEvent.objects.filter(
        worker=worker, reason__contains="already submitted; adopted"
    ).exists()
    return (
        f"{name} paused {paused_for:.0f} s holding a submission's lock (its job "
        f"{'made' if made_while_paused else 'not made'} meanwhile), lock "
        f"{'kept' if lock_kept else 'lost'}, at most {most} job meanwhile; "
        f"{'adopted by a later attempt' if adopted else 'recorded by the paused worker'}, "
        f"all {len(made)} queued {took:.1f} s after SIGCONT with one job each"
    )


def _stop_a_submitter(platform: Platform, ids: set[int]) -> tuple[tuple[int, str] | None, float]:
    """Once one of ``ids`` is being submitted (its agent secret committed, no job recorded: its
    sbatch under way), stop every Celery worker at once, then continue those that do not hold
    that submission's lock. (worker id, the stopped worker's name) and when it was stopped, or
    None when the submission ended before the stop."""
    submitting = mid_submission(ids)
    try:
        wait_for(lambda: list(submitting.values_list("pk", flat=True)), timeout=60, interval=0.002)
    except TimeoutError:
        return None, 0.0
    groups = {name: platform.processes[name].pid for name in CELERY_WORKERS}
    for group in groups.values():
        os.killpg(group, signal.SIGSTOP)
    stopped = time.monotonic()
    still = set(submitting.values_list("pk", flat=True))
    caught = next(
        (
            (worker, name)
            for name in CELERY_WORKERS
            for worker in sorted(set(submitting_processes(platform.child_pids(name))) & still)
        ),
        None,
    )
    for name, group in groups.items():
        if caught is None or name != caught[1]:
            os.killpg(group, signal.SIGCONT)
    return caught, stopped


def _watch(
    client: redis.Redis,
    key: str,
    taken: object,
    keeper: Callable[[], str | None],
    other: str,
    tag: str,
    kept: list[int],
) -> list[str]:
    """For three leases: whatever differs from the successor's lease, row and relay."""
    problems: list[str] = []
    until = time.monotonic() + 3 * RELAY_LEASE
    while time.monotonic() < until and len(problems) < 20:
        value = client.get(key)
        if value != taken:
            problems.append(f"the lease became {value!r}")
        holder = keeper()
        if holder != other:
            problems.append(f"the relay's row names {holder}")
        now_pids = relay_pids(tag)
        if now_pids != kept:
            problems.append(f"relays on the login host {now_pids}, was {kept}")
        time.sleep(0.05)
    return problems


def _sent(log: Path, *, after: float) -> list[tuple[float, str]]:
    """(time, entry) of each task a beat's log says it sent, after ``after``."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    found = [
        (datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2))
        for m in SENT.finditer(text)
    ]
    return [(at, entry) for at, entry in found if at > after]

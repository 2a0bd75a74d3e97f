"""Every poll takes 5 s: a dead agent is still seen within heartbeat timeout + one sweep.

The drill's cluster acts as the account pwalice, whose shells find a slow ``squeue`` first in
PATH (Debian's bash reads ~/.bashrc for the commands sshd runs; the block this drill adds there
and its folder are removed at the end): it sleeps 5 s, then runs the real one, as a loaded
slurmctld answers. Five clusters (the test cluster under five names, a queued worker on each
of the others) are polled every second, so slow polls fill the Celery worker's processes. With
several workers connected one agent is frozen (SIGSTOP); its worker must stop ("Worker
disconnected") within timeout + one sweep interval of the freeze, the others staying connected,
and no heartbeat sweep may come over three intervals after the one before.

``sweeps_on_worker`` runs the sweeps on the ordinary worker instead (no sweeper; the worker
consumes both queues, as before the sweeper existed): the drill should fail then.
"""

from __future__ import annotations

import dataclasses
import pwd
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from drills.drill import Drill, DrillResult, pause
from harness import HarnessError
from harness.agents import freeze_agent, thaw
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, RUN_ENVIRONMENT, ensure_environments
from harness.waiting import wait_until

if TYPE_CHECKING:
    from workers_app.models import Cluster

NAME = "Every poll takes 5 s"
ACCOUNT = "pwalice"
SLOW = 5.0
KNOBS = {"ACTIVATE_POLL_INTERVAL": "1"}
MARK = "# activate drill slow_polls"
WRAPPER = f"""#!/bin/sh
sleep {SLOW:g}
exec /usr/bin/squeue "$@"
"""
# What workers_app.sweeps logs when sweeps came too far apart to count anyone's silence.
GRACE = "heartbeat sweeps stopped for"
POLL_DONE = re.compile(r"poll_cluster\[[^\]]+\] succeeded in ([0-9.]+)s")


def run(
    target: SshTarget, *, connected: int = 3, clusters: int = 5, sweeps_on_worker: bool = False
) -> DrillResult:
    from workers_app.actions import requests
    from workers_app.actions.lifecycle import REASON_DISCONNECTED
    from workers_app.models import WorkerEvent
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    if ACCOUNT not in target.accounts:
        raise HarnessError(f"the test cluster has no account {ACCOUNT}")
    account = dataclasses.replace(target, user=ACCOUNT, key_path=target.accounts[ACCOUNT])
    knobs = dict(KNOBS)
    if sweeps_on_worker:
        knobs["ACTIVATE_WORKER_QUEUES"] = "celery,sweeps"
    home = Path(pwd.getpwnam(ACCOUNT).pw_dir)
    frozen: list[int] = []
    title = NAME + (" (sweeps on the shared worker)" if sweeps_on_worker else "")
    try:
        with Drill("slow-polls", account, title=title, knobs=knobs) as drill:
            platform = drill.platform
            if sweeps_on_worker:
                platform.start_web()
                platform.start_agents()
                platform.start_worker()
                platform.start_beat()
            else:
                platform.start_all()
            running = drill.request(RUN_ENVIRONMENT, connected)
            held = [
                requests.request_worker(
                    owner=drill.owner, cluster=cluster.name, environment=HELD_ENVIRONMENT
                )
                for cluster in more_clusters(drill.cluster, clusters, account.partition)
            ]
            if not (
                drill.wait_status(running, {S.CONNECTED}, timeout=180)
                and drill.wait_status(held, {S.QUEUED}, timeout=60)
            ):
                raise HarnessError(f"workers did not settle: {drill.statuses(running + held)}")
            worker_log = platform.workdir / "worker.log"
            offset = worker_log.stat().st_size
            slow_squeue(home)
            if not wait_until(
                lambda: max(polls(worker_log, offset), default=0) >= SLOW, timeout=60
            ):
                raise HarnessError("no poll took 5 s: the slow squeue is not in the way")
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            # Long enough for the slow polls to fill every process of the worker.
            pause(2 * SLOW)
            victim, others = running[0], running[1:]
            grace_before = platform.log_count(GRACE)
            frozen = freeze_agent(victim.public_id)
            if not frozen:
                raise HarnessError(f"no agent found for {victim.public_id}")
            frozen_at = time.time()
            stopped = drill.wait_status([victim], {S.STOPPED}, timeout=timeout + 60)
            event = WorkerEvent.objects.filter(worker=victim, new_status=S.STOPPED).first()
            durations = polls(worker_log, offset) or [0.0]
            restore_squeue(home)
            grace = platform.log_count(GRACE) - grace_before
            drill.result.repetitions = len(durations)
            took = event.at.timestamp() - frozen_at if stopped and event is not None else None
            seen = f"stopped in {took:.1f} s" if took is not None else "not stopped in 66 s"
            median = statistics.median(durations)
            drill.check(
                took is not None, f"the frozen worker was not stopped: {drill.statuses([victim])}"
            )
            drill.check(
                took is None or took <= timeout + sweep,
                f"stopped {took or 0:.1f} s after its agent froze, over timeout + one sweep "
                f"({timeout + sweep:g} s)",
            )
            drill.check(
                event is None or event.reason == REASON_DISCONNECTED,
                f"stopped for another reason: {event and event.reason}",
            )
            others_now = drill.statuses(others)
            drill.check(
                all(s == S.CONNECTED for s in others_now.values()),
                f"the other workers: {others_now}",
            )
            drill.check(median >= SLOW, f"polls were not slow: median {median:.1f} s")
            drill.check(grace == 0, f"heartbeat sweeps came over 3 intervals apart {grace} times")
            every = drill.knob("ACTIVATE_POLL_INTERVAL")
            drill.note(
                f"{connected} workers connected, {clusters} clusters polled every {every:g} s; "
                f"{len(durations)} polls took {min(durations):.1f}/{median:.1f}/"
                f"{max(durations):.1f} s (min/median/max); agent frozen -> {seen} (timeout "
                f"{timeout:g} s + sweep {sweep:g} s = {timeout + sweep:g} s); heartbeat sweeps "
                f"over 3 intervals apart {grace} times meanwhile"
            )
            return drill.result
    finally:
        restore_squeue(home)
        thaw(frozen)


def more_clusters(cluster: Cluster, count: int, partition: str) -> list[Cluster]:
    """Clusters that are the drill's cluster under other names (a site with several, all slow):
    each is polled on its own, so the polls in flight add up."""
    from workers_app.models import Cluster

    made = []
    for i in range(2, count + 1):
        name = f"{cluster.name}-{i}"
        Cluster.objects.filter(name=name).delete()
        twin = Cluster.objects.get(pk=cluster.pk)
        twin.pk, twin.name = None, name
        twin.save()
        ensure_environments(twin, partition)
        made.append(twin)
    return made


def polls(log: Path, offset: int) -> list[float]:
    """Seconds each poll_cluster task took, by the worker's log from ``offset`` on."""
    try:
        with log.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [float(m.group(1)) for m in POLL_DONE.finditer(text)]


def slow_squeue(home: Path) -> None:
    folder = home / ".activate-drill-bin"
    folder.mkdir(mode=0o755, exist_ok=True)
    wrapper = folder / "squeue"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    bashrc = home / ".bashrc"
    text = bashrc.read_text()
    if MARK not in text:
        # Before the file's "not interactive: return", so commands run over SSH see it too.
        bashrc.write_text(f'PATH="$HOME/.activate-drill-bin:$PATH"  {MARK}\n' + text)


def restore_squeue(home: Path) -> None:
    bashrc = home / ".bashrc"
    text = bashrc.read_text()
    if MARK in text:
        bashrc.write_text("".join(line for line in text.splitlines(True) if MARK not in line))
    shutil.rmtree(home / ".activate-drill-bin", ignore_errors=True)

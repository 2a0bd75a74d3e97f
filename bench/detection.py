"""Detection: from an agent's death to its worker's `stopped`, against the configured timeout.

Real workers run on the real Slurm with their agents heartbeating the running platform (short
knobs: beat every 1 s, timeout 6 s, sweep every 1 s). Each agent is frozen with SIGSTOP (the
node "disappears" while its job keeps the allocation); the time to `stopped` is read from the
worker's event row, written by the sweep that noticed.
"""

from __future__ import annotations

import random
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.report import Goal, Outcome, Table, percentile, seconds
from harness import HarnessError
from harness.agents import freeze_agent, thaw
from harness.cluster import SshTarget
from harness.objects import RUN_ENVIRONMENT, end_run, job_keys, run_user, start_afresh
from harness.platform import FAST_KNOBS, NO_RECONCILE, Platform
from harness.waiting import wait_until

NAME = "detection"
# The agent's own timer: a beat may leave up to this much later than its interval.
BEAT_JITTER = 0.25


def run(target: SshTarget, *, workers: int = 5) -> Outcome:
    from workers_app.actions import requests
    from workers_app.models import Worker, WorkerEvent
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    cluster = start_afresh(target)
    owner = run_user()
    # Each death is timed on its own: the breaker that holds a cluster's workers when most go
    # silent in one sweep (the platform's own outage, tested in the drills) stays out of it.
    knobs = {**NO_RECONCILE, "ACTIVATE_BREAKER_MIN_WORKERS": str(workers + 1)}
    platform = Platform(
        workdir=Path(tempfile.mkdtemp(prefix="bench-detect-")), knobs=knobs, web_as_shipped=True
    )
    interval = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_INTERVAL"])
    timeout = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_TIMEOUT"])
    sweep = float(FAST_KNOBS["ACTIVATE_SWEEP_INTERVAL"])
    frozen: dict[int, list[int]] = {}
    try:
        platform.start_all()
        made = [
            requests.request_worker(owner=owner, cluster=cluster.name, environment=RUN_ENVIRONMENT)
            for _ in range(workers)
        ]
        ids = [w.pk for w in made]
        if not wait_until(
            lambda: Worker.objects.filter(pk__in=ids, status=S.CONNECTED).count() == workers,
            timeout=180,
        ):
            raise HarnessError(f"workers did not connect\n{platform.logs()}")
        time.sleep(3 * interval)
        frozen_at: dict[int, float] = {}
        chooser = random.Random()
        for worker in made:
            # Deaths land anywhere in the beat cycle.
            time.sleep(chooser.uniform(0, interval))
            frozen[worker.pk] = freeze_agent(worker.public_id)
            if not frozen[worker.pk]:
                raise HarnessError(f"no agent process found for {worker.public_id}")
            frozen_at[worker.pk] = time.time()
        wait_until(
            lambda: Worker.objects.filter(pk__in=ids, status=S.STOPPED).count() == workers,
            timeout=timeout + 60,
        )
        detected: list[float] = []
        reasons = set()
        for worker in Worker.objects.filter(pk__in=ids):
            event = WorkerEvent.objects.filter(worker=worker, new_status=S.STOPPED).first()
            if event is None:
                raise HarnessError(f"worker {worker.public_id} was not stopped ({worker.status})")
            reasons.add(event.reason)
            detected.append(_epoch(event.at) - frozen_at[worker.pk])
    finally:
        for pids in frozen.values():
            thaw(pids)
        names = list(job_keys(Worker.objects.values_list("public_id", flat=True)).values())
        wait_until(lambda: not set(names) & set(target.job_names()), timeout=60)
        end_run(platform, target, names)
    return _outcome(detected, reasons, interval, timeout, sweep)


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def _outcome(
    detected: list[float], reasons: set[str], interval: float, timeout: float, sweep: float
) -> Outcome:
    low, high = timeout - interval - BEAT_JITTER, timeout + sweep
    table = Table(
        "Detection: agent frozen (SIGSTOP) -> worker stopped",
        ["workers", "min", "p50", "max", "heartbeat timeout", "window expected", "all inside"],
    )
    inside = all(low <= d <= high for d in detected)
    table.add(
        len(detected),
        seconds(min(detected)),
        seconds(percentile(detected, 50)),
        seconds(max(detected)),
        seconds(timeout),
        f"{low:g}-{high:g} s",
        "yes" if inside else "NO",
    )
    table.notes += [
        f"knobs: heartbeat every {interval:g} s, timeout {timeout:g} s, sweep every {sweep:g} s; "
        f"the last beat before a death is up to one interval old (so >= {timeout - interval:g} s, "
        f"less {BEAT_JITTER:g} s for the agent's own timer), and the sweep runs at most "
        f"{sweep:g} s after the key expires (the README's promise: timeout + one sweep).",
        "all detections: " + ", ".join(seconds(d) for d in sorted(detected)),
        "reasons recorded: " + "; ".join(sorted(reasons)),
    ]
    goals = [
        Goal(
            NAME,
            f"every death seen after timeout - one beat ({low:g} s), within timeout + one sweep "
            f"({high:g} s)",
            f"min {seconds(min(detected))}, max {seconds(max(detected))} for a {timeout:g} s "
            "timeout",
            inside,
        )
    ]
    return Outcome([table], goals)

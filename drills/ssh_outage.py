"""Stop the cluster's SSH server with requests arriving: they stay pending with the cluster
shown offline, and all are submitted after it returns.

`scripts/testcluster.sh stop-sshd` stops the listener and drops the kept connections; it is
started again in a `finally`, whatever happens.
"""

from __future__ import annotations

import time

from drills.drill import Drill, DrillResult, now, pause
from harness import HarnessError
from harness.cluster import SshTarget, testcluster
from harness.objects import HELD_ENVIRONMENT
from harness.waiting import wait_until

NAME = "Stop the SSH server with requests arriving"


def run(target: SshTarget, *, outage: float = 20, arriving: int = 5) -> DrillResult:
    from workers_app.models import Cluster, Reachability
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    with Drill("ssh-outage", target, title=NAME) as drill:
        drill.platform.start_all()
        before = drill.request(HELD_ENVIRONMENT, 2)
        if not drill.wait_status(before, {S.QUEUED}, timeout=90):
            raise HarnessError(f"workers were not submitted: {drill.statuses(before)}")
        stopped_at = now()
        arrived = []
        testcluster("stop-sshd")
        try:
            began = time.monotonic()
            for _ in range(arriving):
                pause(outage / (arriving + 1))
                arrived += drill.request(HELD_ENVIRONMENT)
            pause(max(0.0, outage - (time.monotonic() - began)))
            statuses = drill.statuses(arrived)
            drill.check(
                all(s == S.PENDING for s in statuses.values()),
                f"requests made during the outage left pending: {statuses}",
            )
            cluster = Cluster.objects.get(pk=drill.cluster.pk)
            drill.check(
                cluster.reachability == Reachability.OFFLINE,
                f"cluster shown {cluster.reachability} during the outage, not offline",
            )
            reasons = {w.status_reason for w in drill.workers() if w.status == S.PENDING}
            changes = drill.changes_since(stopped_at, before)
            drill.check(not changes, f"workers submitted before changed status: {changes}")
        finally:
            testcluster("start-sshd")
        back = time.monotonic()
        drill.result.repetitions = len(arrived)
        submitted = drill.wait_status(arrived, {S.QUEUED}, timeout=180)
        took = time.monotonic() - back
        drill.check(
            submitted,
            f"not all were submitted within 180 s of sshd's return: {drill.statuses(arrived)}",
        )
        online = wait_until(
            lambda: Cluster.objects.get(pk=drill.cluster.pk).reachability == Reachability.ONLINE,
            timeout=60,
        )
        drill.check(online, "cluster not shown online again after sshd returned")
        counts = drill.job_counts(arrived)
        drill.check(
            all(n == 1 for n in counts.values()), f"jobs per worker after the outage: {counts}"
        )
        drill.note(
            f"sshd down {outage:g} s; {len(arrived)} requests arrived during it and waited "
            f"pending ({'; '.join(sorted(r[:80] for r in reasons if r))}); all submitted "
            f"{took:.1f} s after sshd returned, one job each"
        )
        return drill.result

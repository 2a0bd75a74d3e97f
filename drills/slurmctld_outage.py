"""Stop slurmctld: no worker changes status; polling resumes after.

Queued (held) and connected workers live through the outage, and one more is requested during
it. Squeue fails the whole time, which must read as "unknown", never as "the job is gone".
After slurmctld returns, one held job is cancelled behind the platform's back: only a working
poll can notice it.
"""

from __future__ import annotations

import subprocess
import time

from drills.drill import Drill, DrillResult, now, pause
from harness.cluster import SshTarget, testcluster
from harness.objects import HELD_ENVIRONMENT

NAME = "Stop slurmctld"
# What workers_app.actions.jobs.poll_cluster logs when a query fails and every status is kept.
POLL_FAILED = "failed, keeping every status"


def run(target: SshTarget, *, outage: float = 20) -> DrillResult:
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    with Drill("slurmctld-outage", target, title=NAME) as drill:
        drill.platform.start_all()
        held, running = drill.settled(queued=2, connected=2)
        before = drill.statuses(held + running)
        failed_polls = drill.log_count(POLL_FAILED)
        stopped_at = now()
        testcluster("stop-slurmctld")
        try:
            pause(outage / 2)
            during = drill.request(HELD_ENVIRONMENT)
            pause(outage / 2)
            changes = drill.changes_since(stopped_at, held + running + during)
            drill.check(not changes, f"status changed while slurmctld was down: {changes}")
            late = drill.statuses(during)
            drill.check(
                all(s == S.PENDING for s in late.values()),
                f"a request made during the outage is not pending: {late}",
            )
        finally:
            testcluster("start-slurmctld")
        back = time.monotonic()
        drill.result.repetitions = drill.log_count(POLL_FAILED) - failed_polls
        drill.check(drill.result.repetitions > 0, "no poll ran while slurmctld was down")
        # Only a poll can notice a job cancelled outside the platform.
        victim = held[0]
        victim.refresh_from_db()
        subprocess.run(["scancel", victim.scheduler_job_id], check=False, timeout=30)
        noticed = drill.wait_status([victim], {S.STOPPED, S.ERROR}, timeout=90)
        took = time.monotonic() - back
        drill.check(
            noticed, f"a job cancelled after the outage was not noticed: {drill.statuses([victim])}"
        )
        submitted = drill.wait_status(during, {S.QUEUED}, timeout=120)
        drill.check(
            submitted,
            f"the request made during the outage was not submitted: {drill.statuses(during)}",
        )
        survivors = drill.statuses(held[1:] + running)
        drill.check(
            all(before[p] == s for p, s in survivors.items()),
            f"statuses after the outage: {survivors}, before: {before}",
        )
        drill.note(
            f"slurmctld down {outage:g} s with 2 queued and 2 connected workers; "
            f"{drill.result.repetitions} polls failed and kept every status; 1 request arrived "
            "during the outage; no status "
            f"change; after its return a job cancelled outside was noticed in {took:.1f} s and "
            "the waiting request submitted"
        )
        return drill.result

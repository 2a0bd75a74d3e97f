"""Delete workers in every status, including mid-submit: afterwards no `pw-worker-*` job of a
deleted worker remains in squeue.

Statuses covered: pending (deleted as its submission starts, or 0-0.3 s after the request:
before, during or just after its submission), queued, starting (its agent cannot call back:
the agents' server is down meanwhile), connected, stopping (deleted twice), and stopped (deleted
again). Mid-submit requests and deletions call workers_app.services (what the API calls)
in-process, to land inside a submission's ~0.15 s; the others go through the API.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from drills.drill import Drill, DrillResult, pause, submissions_in_progress
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, RUN_ENVIRONMENT, job_name
from harness.waiting import wait_until

NAME = "Delete workers in every status, including mid-submit"


def run(target: SshTarget, *, mid_submit: int = 10) -> DrillResult:
    from workers_app import services
    from workers_app.models import Worker, WorkerEvent
    from workers_app.statuses import FINISHED, WorkerStatus

    S = WorkerStatus
    chooser = random.Random()
    deleted_in: Counter[str] = Counter()
    with Drill("deletion", target, title=NAME) as drill:
        platform = drill.platform
        platform.start_all()

        def delete(worker: Worker) -> None:
            worker.refresh_from_db()
            deleted_in[worker.status] += 1
            status = drill.delete(worker)
            drill.check(status == 202, f"DELETE of a {worker.status} worker answered {status}")

        # Starting: the job runs but its agent cannot call back while the agents' server is down.
        platform.stop("agents")
        starting = services.request_worker(
            owner=drill.owner, cluster=drill.cluster.name, environment=RUN_ENVIRONMENT
        )
        if not drill.wait_status([starting], {S.STARTING}, timeout=90):
            raise HarnessError(f"no worker reached starting: {drill.statuses([starting])}")
        deleted_in[S.STARTING] += 1
        services.delete_worker(starting)
        platform.start_agents()

        queued, connected = drill.settled(queued=2, connected=3)
        for worker in queued + connected[:2]:
            delete(worker)
        # Stopping: the second deletion arrives while the first waits for the scheduler.
        delete(connected[2])
        delete(connected[2])
        # Mid-submit: half are deleted the moment their submission takes its lock (before it
        # talks to the cluster), half a random 0-300 ms after the request. A lock-timed
        # deletion counts when the submission still held its lock once the deletion was done;
        # one that came too late is tried again with another worker (as many times at most).
        timed, late, number = 0, 0, 0
        while number < mid_submit and late <= mid_submit:
            worker = services.request_worker(
                owner=drill.owner, cluster=drill.cluster.name, environment=HELD_ENVIRONMENT
            )
            lock_timed = number % 2 == 0
            if lock_timed:
                wait_until(_submitting(worker.pk), timeout=10, interval=0.002)
            else:
                pause(chooser.uniform(0, 0.3))
            worker.refresh_from_db()
            status = worker.status
            services.delete_worker(worker)
            if lock_timed and worker.pk not in submissions_in_progress():
                late += 1  # deleted, but not amid its submission: not counted
                continue
            deleted_in[status] += 1
            timed += lock_timed
            number += 1
        drill.check(
            timed == (mid_submit + 1) // 2,
            f"only {timed} deletions landed while their submission held its lock ({late} late)",
        )
        # Already ended: deleting again changes nothing.
        if drill.wait_status(queued[:1], set(FINISHED), timeout=60):
            delete(queued[0])

        workers = drill.workers()
        drill.result.repetitions = sum(deleted_in.values())
        ended = drill.wait_status(workers, set(FINISHED), timeout=90)
        drill.check(ended, f"deleted workers not ended: {drill.statuses(workers)}")
        names = {job_name(w.public_id) for w in workers}
        gone = wait_until(lambda: not names & set(target.job_names()), timeout=90, interval=1)
        left = sorted(names & set(target.job_names()))
        drill.check(gone, f"jobs of deleted workers still in squeue: {left}")
        counts = drill.job_counts(workers)
        drill.check(
            all(n <= 1 for n in counts.values()),
            f"workers with more than one job: {[k for k, n in counts.items() if n > 1]}",
        )
        late_jobs = WorkerEvent.objects.filter(
            worker__in=workers, reason__contains="created after the worker ended"
        ).count()
        drill.note(
            "deleted in: "
            + ", ".join(f"{status} {n}" for status, n in sorted(deleted_in.items()))
            + f"; {timed} while their submission held its lock ({late} came too late and were "
            f"tried again); {late_jobs} jobs were created after their worker was deleted and then "
            "cancelled; no job of a deleted worker left in squeue"
        )
        return drill.result


def _submitting(worker_id: int) -> Callable[[], bool]:
    return lambda: worker_id in submissions_in_progress()

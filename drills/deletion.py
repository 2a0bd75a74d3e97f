"""Delete workers in every status, including mid-submit: afterwards no `pw-worker-*` job of a
deleted worker remains in squeue.

Statuses covered: pending (deleted in its submission's dangerous window, its job made by sbatch
and not yet recorded, one of a bulk of two whose jobs go together (a Slurm array); or 0-0.3 s
after the request: before, during or just after its submission), queued, starting (its agent
cannot call back: the agents' server is down meanwhile), connected, stopping (deleted twice),
and stopped (deleted again). Mid-submit requests and deletions call workers_app.actions (what
the API calls) in-process; the window is held open (drills.drill recording_held: the row locked
once the agent secret is committed, until squeue lists the job), and a deletion counts as in it
only when, as it was made, squeue listed the worker's job and its row had no job id. The drill
fails when fewer than half the mid-submit deletions landed so, or when such a worker's job was
not taken up for cancelling.
The others go through the API.
"""

from __future__ import annotations

import random
from collections import Counter

from drills.drill import Drill, DrillResult, pause, recording_held, unrecorded
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, RUN_ENVIRONMENT, job_keys, job_name
from harness.waiting import wait_until

NAME = "Delete workers in every status, including mid-submit"


def run(target: SshTarget, *, mid_submit: int = 10) -> DrillResult:
    from workers_app.actions import deletion, requests
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
        starting = requests.request_worker(
            owner=drill.owner, cluster=drill.cluster.name, environment=RUN_ENVIRONMENT
        )
        if not drill.wait_status([starting], {S.STARTING}, timeout=90):
            raise HarnessError(f"no worker reached starting: {drill.statuses([starting])}")
        deleted_in[S.STARTING] += 1
        deletion.delete_worker(starting)
        platform.start_agents()

        queued, connected = drill.settled(queued=2, connected=3)
        for worker in queued + connected[:2]:
            delete(worker)
        # Stopping: the second deletion arrives while the first waits for the scheduler.
        delete(connected[2])
        delete(connected[2])
        # Mid-submit: half are deleted in their submission's window (job made, not recorded),
        # half a random 0-300 ms after the request. A deletion that missed its window is not
        # counted and is tried again with another worker (as many times at most).
        in_window: dict[int, str] = {}
        missed, number = 0, 0
        while number < mid_submit and missed <= mid_submit:
            if number % 2 == 0:
                # A bulk of two, submitted together (on Slurm one array): the first is deleted
                # in the window, its sibling once its job is recorded.
                worker, sibling = requests.request_workers(
                    owner=drill.owner,
                    cluster=drill.cluster.name,
                    environment=HELD_ENVIRONMENT,
                    count=2,
                )
                with recording_held(target, [worker.pk, sibling.pk]) as window:
                    listed = {pk: j for pk, j in unrecorded(window).items() if pk == worker.pk}
                    worker.refresh_from_db()
                    status = worker.status
                    deletion.delete_worker(worker)
                    # Pending to stopped is the deletion finding the row still without its job.
                    worker.refresh_from_db()
                    hit = listed if worker.status == S.STOPPED else {}
                drill.wait_status([sibling], {S.QUEUED}, timeout=30)
                sibling.refresh_from_db()
                deleted_in[sibling.status] += 1
                deletion.delete_worker(sibling)
                if not hit:
                    missed += 1  # deleted, but not in its window: not counted
                    continue
                in_window.update(hit)
            else:
                worker = requests.request_worker(
                    owner=drill.owner, cluster=drill.cluster.name, environment=HELD_ENVIRONMENT
                )
                pause(chooser.uniform(0, 0.3))
                worker.refresh_from_db()
                status = worker.status
                deletion.delete_worker(worker)
            deleted_in[status] += 1
            number += 1
        drill.check(
            len(in_window) == (mid_submit + 1) // 2,
            f"only {len(in_window)} of {(mid_submit + 1) // 2} deletions landed in a "
            f"submission's window (its job made, not recorded; {missed} missed it)",
        )
        # Already ended: deleting again changes nothing.
        if drill.wait_status(queued[:1], set(FINISHED), timeout=60):
            delete(queued[0])

        workers = drill.workers()
        drill.result.repetitions = sum(deleted_in.values())
        ended = drill.wait_status(workers, set(FINISHED), timeout=90)
        drill.check(ended, f"deleted workers not ended: {drill.statuses(workers)}")
        names = set(job_keys(w.public_id for w in workers).values())
        gone = wait_until(lambda: not names & set(target.job_names()), timeout=90, interval=1)
        left = sorted(names & set(target.job_names()))
        drill.check(gone, f"jobs of deleted workers still in squeue: {left}")
        counts = drill.job_counts(workers)
        drill.check(
            all(n <= 1 for n in counts.values()),
            f"workers with more than one job: {[k for k, n in counts.items() if n > 1]}",
        )
        late = WorkerEvent.objects.filter(
            worker__in=workers, reason__contains="created after the worker ended"
        )
        late_jobs = late.count()
        cancelled = set(late.values_list("worker_id", "reason"))
        untaken = [
            f"{job_name(public_id)} (job {in_window[pk]})"
            for pk, public_id in Worker.objects.filter(pk__in=list(in_window)).values_list(
                "pk", "public_id"
            )
            if not any(w == pk and f"Job {in_window[pk]} " in r for w, r in cancelled)
        ]
        drill.check(
            not untaken,
            f"deleted in the window, their job not taken up for cancelling: {untaken}",
        )
        drill.note(
            "deleted in: "
            + ", ".join(f"{status} {n}" for status, n in sorted(deleted_in.items()))
            + f"; {len(in_window)} with their job made and not recorded ({missed} missed that "
            f"window and were tried again), each job then taken up for cancelling; {late_jobs} "
            "jobs were created after their worker was deleted and then cancelled; no job of a "
            "deleted worker left in squeue"
        )
        return drill.result

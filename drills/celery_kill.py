"""SIGKILL the Celery worker during submissions, many times: every worker ends with exactly one
job; none lost, none duplicated.

Each round requests a burst of (held) workers (every other one in a single bulk request, so a
batch is killed mid-way) and, while their submissions hold their locks
(between the name lookup, sbatch and recording the job), kills either the whole worker (main
process and its prefork children) or the child whose task holds a submission. A kill counts
only when its process held a submission's lock a moment before; the drill fails when fewer
than asked landed. Killed tasks come
back (acks_late: redelivered after the visibility timeout; a lost child's task is rejected and
requeued) and the dispatch sweep resends pending workers whose lease ran out.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

from drills.drill import (
    Drill,
    DrillResult,
    pause,
    submissions_in_progress,
    submitting_processes,
)
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT
from harness.waiting import wait_until

NAME = "SIGKILL the Celery worker during submissions"


def run(target: SshTarget, *, kills: int = 8, burst: int = 6) -> DrillResult:
    from workers_app.models import WorkerEvent
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    chooser = random.Random()
    with Drill("celery-kill", target, title=NAME) as drill:
        platform = drill.platform
        platform.start_all()
        kinds = {"whole worker": 0, "one prefork child": 0}
        missed = 0
        # A kill counts when it landed: the process it killed held a submission's lock (between
        # the name lookup, sbatch and recording) a moment before. A round whose submissions
        # ended first is a miss and is tried again, up to three times as many as kills asked.
        while sum(kinds.values()) < kills and missed <= 3 * kills:
            whole = sum(kinds.values()) % 2 == 0
            # Every other burst is one bulk request: its workers are submitted as one batch.
            made = drill.request(HELD_ENVIRONMENT, burst, bulk=not whole)
            ids = {w.pk for w in made}
            wait_until(_submitting(ids), timeout=30, interval=0.005)
            # A submission holds its lock some tens of milliseconds: kill within that.
            pause(chooser.uniform(0, 0.01))
            children = platform.child_pids("worker")
            holders = {
                worker: pid
                for worker, pid in submitting_processes(children).items()
                if worker in ids
            }
            if not holders:
                missed += 1
                continue
            if whole:
                platform.kill("worker")
                platform.start_worker()
                kinds["whole worker"] += 1
            else:
                os.kill(chooser.choice(sorted(set(holders.values()))), signal.SIGKILL)
                kinds["one prefork child"] += 1
        landed = sum(kinds.values())
        drill.result.repetitions = landed
        drill.check(
            landed == kills,
            f"only {landed} of {kills} kills landed during a submission ({missed} rounds missed)",
        )
        workers = drill.workers()
        started = time.monotonic()
        # Lost tasks come back after the lease (dispatch) or the visibility timeout.
        settle = drill.knob("ACTIVATE_TASK_VISIBILITY_TIMEOUT") + 60
        settled = drill.wait_status(workers, {S.QUEUED}, timeout=settle)
        took = time.monotonic() - started
        statuses = drill.statuses(workers)
        not_queued = {p: s for p, s in statuses.items() if s != S.QUEUED}
        drill.check(settled, f"not all workers reached queued within {settle:g} s: {not_queued}")
        counts = drill.job_counts(workers)
        lost = [name for name, n in counts.items() if n == 0]
        doubled = {name: n for name, n in counts.items() if n > 1}
        drill.check(not lost, f"workers without a job: {lost}")
        drill.check(not doubled, f"workers with more than one job: {doubled}")
        for worker in workers:
            worker.refresh_from_db()
            listed = drill.job_ids(worker)
            if listed and worker.scheduler_job_id:
                drill.check(
                    listed == [worker.scheduler_job_id],
                    f"{worker.public_id} records {worker.scheduler_job_id}, squeue has {listed}",
                )
        adopted = WorkerEvent.objects.filter(
            worker__in=workers, reason__contains="already submitted; adopted"
        ).count()
        lost_tasks = drill.log_count("WorkerLostError(")
        drill.note(
            f"{len(workers)} workers, {kinds['whole worker']} kills of the whole worker and "
            f"{kinds['one prefork child']} of the child holding a submission, each while a "
            f"submission held its lock ({missed} rounds whose submissions ended first, tried "
            f"again); all queued {took:.0f} s after the last kill; {lost_tasks} tasks killed "
            f"mid-run in a child; {adopted} found their job already made and adopted it (a kill "
            "between sbatch and recording)"
        )
        return drill.result


def _submitting(ids: set[int]) -> Callable[[], bool]:
    return lambda: bool(ids & submissions_in_progress())

"""SIGKILL the Celery worker during submissions, many times: every worker ends with exactly one
job; none lost, none duplicated.

Each round requests a burst of (held) workers (every other one in a single bulk request, so a
batch is killed mid-way) and kills, in the dangerous window of a submission (its job made by
sbatch, not yet recorded), either the whole worker (main process and its prefork children) or
the child whose task holds that submission. The window is held open (drills.drill
recording_held: the worker's row locked once its agent secret is committed, until squeue lists
its job), and a kill counts only when squeue listed the worker's job before it, the killed
process held its submission, and the row still had no job id once the process was dead; the
drill fails when fewer kills than asked landed so, and when a caught worker does not end with
the very job listed at its kill. Killed tasks come back (acks_late: redelivered after the
visibility timeout; a lost child's task is rejected and requeued) and the dispatch sweep resends
pending workers whose lease ran out; they find the job by name and adopt it.
"""

from __future__ import annotations

import os
import random
import signal
import time

from drills.drill import Drill, DrillResult, recording_held, submitting_processes, unrecorded
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, job_name

NAME = "SIGKILL the Celery worker during submissions"


def run(target: SshTarget, *, kills: int = 8, burst: int = 6) -> DrillResult:
    from workers_app.models import Worker, WorkerEvent
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    chooser = random.Random()
    with Drill("celery-kill", target, title=NAME) as drill:
        platform = drill.platform
        platform.start_all()
        kinds = {"whole worker": 0, "one prefork child": 0}
        missed = 0
        # Worker pk -> the job squeue listed under its name when its submitter was killed.
        caught: dict[int, str] = {}
        # A round whose window was not caught (its submissions recorded first, or the killed
        # process did not hold a caught one) is a miss and is tried again, up to three times
        # as many as kills asked.
        while sum(kinds.values()) < kills and missed <= 3 * kills:
            whole = sum(kinds.values()) % 2 == 0
            # Every other burst is one bulk request: its workers are submitted as one batch.
            made = drill.request(HELD_ENVIRONMENT, burst, bulk=not whole)
            with recording_held(target, {w.pk for w in made}) as window:
                holders = {
                    worker: pid
                    for worker, pid in submitting_processes(platform.child_pids("worker")).items()
                    if worker in window
                }
                # Just before the kill: the job listed, the row without it, the holder.
                hit = {w: job for w, job in unrecorded(window).items() if w in holders}
                if not hit:
                    missed += 1
                    continue
                if whole:
                    platform.kill("worker")
                else:
                    pid = holders[chooser.choice(sorted(hit))]
                    os.kill(pid, signal.SIGKILL)
                    hit = {w: job for w, job in hit.items() if holders[w] == pid}
                # Still without its job once its submitter is dead: the kill came in time.
                hit = unrecorded(hit)
            if whole:
                platform.start_worker()
            if not hit:
                missed += 1
                continue
            caught.update(hit)
            kinds["whole worker" if whole else "one prefork child"] += 1
        landed = sum(kinds.values())
        drill.result.repetitions = landed
        drill.check(
            landed == kills,
            f"only {landed} of {kills} kills landed in a submission's window (its job made, "
            f"not recorded; {missed} rounds missed it)",
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
        kept = Worker.objects.filter(pk__in=list(caught)).values_list(
            "pk", "public_id", "scheduler_job_id"
        )
        strayed = {
            job_name(public_id): f"{caught[pk]} at the kill, {job_id or 'none'} recorded"
            for pk, public_id, job_id in kept
            if job_id != caught[pk]
        }
        drill.check(
            not strayed, f"workers caught in the window that did not keep their job: {strayed}"
        )
        adopted = WorkerEvent.objects.filter(
            worker__in=workers, reason__contains="already submitted; adopted"
        ).count()
        lost_tasks = drill.log_count("WorkerLostError(")
        drill.note(
            f"{len(workers)} workers, {kinds['whole worker']} kills of the whole worker and "
            f"{kinds['one prefork child']} of the child holding a submission, each while a "
            f"job it submitted was made and not recorded ({len(caught)} such jobs; {missed} "
            f"rounds missed the window and were tried again); all queued {took:.0f} s after "
            f"the last kill; {lost_tasks} tasks killed mid-run in a child; {adopted} found "
            "their job already made and adopted it; every caught worker kept the job listed at "
            "its kill"
        )
        return drill.result

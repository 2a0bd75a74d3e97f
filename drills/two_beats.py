"""Two beat processes at once for a while: no transition is recorded twice.

Both beats send every sweep and poll, so two copies of each run side by side on the Celery
worker's processes while there is work for them: queued workers timing out (short queued
timeout), agents going silent (frozen with SIGSTOP), a deletion, fresh requests. Afterwards no
(worker, old status, new status) with old != new may appear twice in the event table.

The beat lease (core/beat.py) would let only one of them send; it is off here
(ACTIVATE_BEAT_LEASE=0), because a holder paused past its lease can still send once beside its
successor: the compare-and-set must hold on its own. drills/beat_failover.py runs with it.
"""

from __future__ import annotations

from pathlib import Path

from drills.drill import Drill, DrillResult, pause
from harness import HarnessError
from harness.agents import freeze_agent, thaw
from harness.cluster import SshTarget
from harness.objects import HELD_ENVIRONMENT, RUN_ENVIRONMENT

NAME = "Two beat processes at once"
KNOBS = {
    "ACTIVATE_PENDING_TIMEOUT": "15",
    "ACTIVATE_QUEUED_TIMEOUT": "20",
    "ACTIVATE_BEAT_LEASE": "0",
}


def run(target: SshTarget, *, duration: float = 40) -> DrillResult:
    from django.db.models import Count, F

    from workers_app.models import WorkerEvent
    from workers_app.statuses import FINISHED, WorkerStatus

    S = WorkerStatus
    frozen: list[int] = []
    try:
        with Drill("two-beats", target, title=NAME, knobs=KNOBS) as drill:
            platform = drill.platform
            platform.start_web()
            platform.start_agents()
            platform.start_worker()
            platform.start_sweeper()
            platform.start_beat("beat")
            platform.start_beat("beat2")
            running = drill.request(RUN_ENVIRONMENT, 3)
            drill.request(HELD_ENVIRONMENT, 6)
            if not drill.wait_status(running, {S.CONNECTED}, timeout=120):
                raise HarnessError(f"workers did not connect: {drill.statuses(running)}")
            for worker in running[:2]:
                frozen += freeze_agent(worker.public_id)
            drill.delete(running[2])
            pause(duration / 2)
            drill.request(HELD_ENVIRONMENT, 3)
            pause(duration / 2)
            workers = drill.workers()
            timeout = drill.knob("ACTIVATE_QUEUED_TIMEOUT") + 60
            drill.check(
                drill.wait_status(workers, set(FINISHED), timeout=timeout),
                f"not every worker ended within {timeout:g} s: {drill.statuses(workers)}",
            )
            twice = list(
                WorkerEvent.objects.filter(worker__in=workers)
                .exclude(old_status=F("new_status"))
                .values("worker__public_id", "old_status", "new_status")
                .annotate(times=Count("id"))
                .filter(times__gt=1)
            )
            drill.check(not twice, f"transitions recorded more than once: {twice}")
            transitions = (
                WorkerEvent.objects.filter(worker__in=workers)
                .exclude(old_status=F("new_status"))
                .count()
            )
            counts = drill.job_counts(workers)
            drill.check(
                all(n <= 1 for n in counts.values()),
                f"workers with more than one job: {[k for k, n in counts.items() if n > 1]}",
            )
            sends = [_sent(platform.workdir / f"{name}.log") for name in ("beat", "beat2")]
            drill.check(all(sends), f"a beat process sent nothing: {sends}")
            drill.result.repetitions = transitions
            ends = sorted(
                {w.status_reason for w in workers if w.status_reason}, key=lambda r: r[:20]
            )
            drill.note(
                f"two beats sent {sends[0]} and {sends[1]} tasks over {duration:g} s; "
                f"{len(workers)} workers made {transitions} transitions, each recorded once "
                f"(ends: {'; '.join(r[:50] for r in ends)})"
            )
            return drill.result
    finally:
        thaw(frozen)


def _sent(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("Sending due task")
    except OSError:
        return 0

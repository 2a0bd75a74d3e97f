"""PostgreSQL stopped for three heartbeat timeouts: no worker changes status, and a request that
was answered 201 just before the outage is not lost (it exists and is submitted afterwards).

The machine's PostgreSQL is shared, so the drill starts one of its own (drills.servers) and
points this process's Django, and so the platform it starts, at it.
"""

from __future__ import annotations

import os
import signal
import time

from drills.drill import Drill, DrillResult, now, pause
from drills.servers import PostgresServer, django_on
from harness.cluster import SshTarget
from harness.objects import CLUSTER_NAME, HELD_ENVIRONMENT, job_key

NAME = "PostgreSQL stopped for 3x the heartbeat timeout"


def run(target: SshTarget, *, factor: float = 3.0) -> DrillResult:
    from django.db import connection

    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    server = PostgresServer()
    try:
        server.start()
        with (
            django_on(server),
            Drill("postgres-outage", target, title=NAME) as drill,
        ):
            drill.platform.start_all()
            queued, connected = drill.settled(queued=2, connected=3)
            everyone = queued + connected
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            # The Celery worker is paused (SIGSTOP) across the request and the stop, so that the
            # request's submission can only happen after the outage began.
            celery = drill.platform.processes["worker"].pid
            os.killpg(celery, signal.SIGSTOP)
            with drill.platform.api(drill.key) as api:
                answer = api.post(
                    "/api/workers/",
                    json={"cluster": CLUSTER_NAME, "environment": HELD_ENVIRONMENT, "params": {}},
                )
            drill.check(answer.status_code == 201, f"request answered {answer.status_code}")
            late_id = answer.json().get("id", "")
            at_stop = list(
                Worker.objects.filter(public_id=late_id).values_list("status", flat=True)
            )
            began = now()
            down = time.monotonic()
            server.stop()
            stopping = time.monotonic() - down
            os.killpg(celery, signal.SIGCONT)
            pause(max(0.0, factor * timeout - (time.monotonic() - down)))
            server.start()
            back = time.monotonic()
            # This process's own connection died with the server too.
            connection.close()
            outage = back - down
            drill.result.repetitions = 1
            late = list(Worker.objects.filter(public_id=late_id))
            drill.check(len(late) == 1, f"the request answered 201 ({late_id}) is gone")
            submitted = bool(late) and drill.wait_status(late, {S.QUEUED}, timeout=120)
            took = time.monotonic() - back
            drill.check(
                submitted, f"the request answered 201 was not submitted: {drill.statuses(late)}"
            )
            jobs = drill.job_counts(late).get(job_key(late_id), 0)
            drill.check(jobs == 1, f"the request answered 201 has {jobs} jobs")
            pause(max(0.0, timeout + 3 * sweep - (time.monotonic() - back)))
            changes = drill.changes_since(began, everyone)
            drill.check(not changes, f"status changed across the PostgreSQL outage: {changes}")
            silent = drill.silent(connected)
            drill.check(not silent, f"heartbeats did not resume after the outage: {silent}")
            history = drill.changes_since(began, late)
            drill.note(
                f"{len(connected)} connected and {len(queued)} queued workers; PostgreSQL down "
                f"{outage:.1f} s (stopping took {stopping:.1f} s; heartbeat timeout "
                f"{timeout:g} s); "
                f"no status change, every agent beating {timeout + 3 * sweep:g} s after; a request "
                f"answered 201 just before the outage ({'/'.join(at_stop)} when it began): "
                f"{'; '.join(history) or 'no change'}, "
                f"queued with {jobs} job {took:.1f} s after PostgreSQL returned"
            )
            return drill.result
    finally:
        server.remove()

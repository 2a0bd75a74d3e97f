"""Fail PostgreSQL over to its standby with workers connected and requests flowing.

The platform runs on scripts/standby.sh's pair, named as libpq's several hosts in DATABASE_URL
(the primary on 5440, a synchronous streaming standby on 5441, ``target_session_attrs=
read-write``). With workers connected and a worker requested every second, the primary is
stopped at once (``-m immediate``) mid-submission (Celery, held by SIGSTOP while three more
requests were answered, let go 0.3 s before) and the standby promoted. Then: the platform
answers requests again within ``bound`` seconds of the promotion (measured: the first 201 after
it); every request answered 201 ends in exactly one job and connects; no connected worker
changes status; no platform process ends.
The pair is made again afterwards (its data is the drill's alone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from drills.drill import Drill, DrillResult, now, pause
from drills.redis_failover import RequestStream
from harness import REPO, HarnessError
from harness.cluster import SshTarget
from harness.objects import RUN_ENVIRONMENT

NAME = "PostgreSQL fails over to its standby"
SCRIPT = REPO / "scripts" / "standby.sh"
PRIMARY, STANDBY = 5440, 5441
DATABASE = "activate_drills"


def pair_up() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise HarnessError(f"scripts/standby.sh up failed: {done.stderr[-500:]}")


def cluster(*argv: str) -> None:
    version = sorted(os.listdir("/usr/lib/postgresql"), key=int)[-1]
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(command)} failed: {done.stderr[-500:]}")


@contextmanager
def django_on_pair() -> Iterator[None]:
    """This process's Django, and so the platform it starts, on the pair by both its hosts:
    the database created on the primary (the standby follows) and migrated."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    from harness.django_setup import ensure_database

    default = settings.DATABASES["default"]
    keys = ("HOST", "PORT", "NAME", "OPTIONS")
    saved = {key: default.get(key) for key in keys}
    ensure_database(f"postgres://postgres@127.0.0.1:{PRIMARY}/{DATABASE}")
    connections["default"].close()
    for settings_dict in (default, connections["default"].settings_dict):
        settings_dict["HOST"] = "127.0.0.1,127.0.0.1"
        settings_dict["PORT"] = f"{PRIMARY},{STANDBY}"
        settings_dict["NAME"] = DATABASE
        settings_dict["OPTIONS"] = {
            **(saved["OPTIONS"] or {}),
            "target_session_attrs": "read-write",
            "connect_timeout": 2,
        }
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield
    finally:
        connections["default"].close()
        for settings_dict in (default, connections["default"].settings_dict):
            settings_dict.update(saved)


def run(
    target: SshTarget, *, workers: int = 4, requests: int = 12, bound: float = 15.0
) -> DrillResult:
    from django.db import connection

    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    pair_up()
    try:
        with django_on_pair(), Drill("postgres-failover", target, title=NAME) as drill:
            drill.platform.start_all()
            made = drill.request(RUN_ENVIRONMENT, workers)
            if not drill.wait_status(made, {S.CONNECTED}, timeout=180):
                raise HarnessError(f"workers did not connect: {drill.statuses(made)}")
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")

            stream = RequestStream(drill, requests, every=1.0)
            stream.start()
            pause(requests / 4)  # a quarter of the requests before the stop, the rest after
            # Mid-submission: Celery held (SIGSTOP) while requests are answered, let go, and the
            # primary stopped while it submits them.
            celery = drill.platform.processes["worker"].pid
            os.killpg(celery, signal.SIGSTOP)
            held = drill.request(RUN_ENVIRONMENT, 3)
            stream.made += [w.pk for w in held]
            in_flight = Worker.objects.filter(pk__in=list(stream.made), status=S.PENDING).count()
            os.killpg(celery, signal.SIGCONT)
            pause(0.3)
            stopped_at = now()
            stopped = time.monotonic()
            cluster("activate_primary", "stop", "-m", "immediate")
            cluster("activate_standby", "promote")
            promoted = time.monotonic()
            connection.close()  # this process's own went with the primary
            drill.result.repetitions += 1
            stream.join(timeout=requests * 30)

            answered = stream.answered_at
            again = [at - promoted for at in answered if at > promoted]
            drill.check(
                bool(again), f"no request answered 201 after the promotion: {stream.refused[-3:]}"
            )
            first = again[0] if again else float("nan")
            drill.check(first <= bound, f"requests answered again {first:.1f} s after promotion")
            pause(max(0.0, timeout + 3 * sweep - (time.monotonic() - promoted)))
            changes = drill.changes_since(stopped_at, made)
            drill.check(not changes, f"status changed through the failover: {changes}")
            ended = {
                n: p.returncode for n, p in drill.platform.processes.items() if p.poll() is not None
            }
            drill.check(not ended, f"platform processes ended through the failover: {ended}")
            requested = list(Worker.objects.filter(pk__in=stream.made))
            connected = drill.wait_status(requested, {S.CONNECTED}, timeout=180)
            drill.check(connected, f"requests answered 201: {drill.statuses(requested)}")
            counts = drill.job_counts(requested)
            wrong = {name: n for name, n in counts.items() if n != 1}
            drill.check(not wrong, f"requests not ending in exactly one job: {wrong}")
            drill.note(
                f"{workers} connected workers, {requests} requests 1 s apart around the stop; "
                f"primary stopped (-m immediate) and standby promoted in "
                f"{promoted - stopped:.1f} s; requests answered again {first:.2f} s after the "
                f"promotion; {in_flight} submissions under way at the stop; "
                f"{len(stream.made)} answered 201 ({len(stream.refused)} refused "
                f"meanwhile, as a user would see), jobs per request "
                f"{sorted(set(counts.values()))}; {len(changes)} status changes"
            )
            result = drill.result
    finally:
        pair_up()
    return result

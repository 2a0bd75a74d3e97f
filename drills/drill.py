"""What every drill shares: a running platform, workers requested through its API, checks.

A drill records failed checks instead of stopping at the first, so its table row says
everything that went wrong; whatever it stopped or started is restored in ``close``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import (
    CLUSTER_NAME,
    HELD_ENVIRONMENT,
    RUN_ENVIRONMENT,
    all_workers,
    end_run,
    job_key,
    job_keys,
    job_name,
    run_user,
    start_afresh,
)
from harness.platform import NO_RECONCILE, Platform
from harness.waiting import wait_until

# The test settings switch off the heartbeat sweep's check that agents can reach the platform
# (tests/ drive sweeps by hand); every drill runs with it on, as shipped.
HEARING = {"ACTIVATE_HEARING_PROBE": "true"}

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from workers_app.models import Worker


@dataclass
class DrillResult:
    drill: str
    repetitions: int
    failures: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


class Drill:
    """One drill's platform, workers and verdict. Use as a context manager."""

    def __init__(
        self,
        name: str,
        target: SshTarget,
        *,
        title: str = "",
        knobs: dict[str, str] | None = None,
        redis_url: str = "",
    ) -> None:
        from workers_app.models import ApiKey

        self.name = name
        self.target = target
        self.cluster = start_afresh(target)
        self.owner = run_user("drill")
        ApiKey.objects.filter(user=self.owner).delete()
        _, self.key = ApiKey.issue(self.owner, name=name)
        self.platform = Platform(
            workdir=Path(tempfile.mkdtemp(prefix=f"drill-{name}-")),
            knobs={**NO_RECONCILE, **HEARING, **(knobs or {})},
            redis_url=redis_url,
            web_as_shipped=True,
        )
        self.result = DrillResult(title or name, 0)

    def __enter__(self) -> Drill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- verdict ----------------------------------------------------------------------------

    def check(self, ok: bool, message: str) -> bool:
        if not ok:
            self.result.failures.append(message)
        return ok

    def note(self, text: str) -> None:
        self.result.details.append(text)

    def log_count(self, text: str) -> int:
        return self.platform.log_count(text)

    def knob(self, name: str) -> float:
        return float(self.platform.env()[name])

    # -- workers ----------------------------------------------------------------------------

    def request(self, environment: str, count: int = 1, *, bulk: bool = False) -> list[Worker]:
        """Workers requested through POST /api/workers/, as a user would (with ``bulk``, all in
        one request: one task submits them together)."""
        from workers_app.models import Worker

        ids = []
        with self.platform.api(self.key) as api:
            if bulk:
                answer = api.post(
                    "/api/workers/",
                    json={"cluster": CLUSTER_NAME, "environment": environment, "count": count},
                )
                if answer.status_code != 201:
                    raise HarnessError(f"bulk POST /api/workers/ answered {answer.status_code}")
                ids = [worker["id"] for worker in answer.json()["workers"]]
            for _ in range(0 if bulk else count):
                answer = api.post(
                    "/api/workers/",
                    json={"cluster": CLUSTER_NAME, "environment": environment, "params": {}},
                )
                if answer.status_code != 201:
                    raise HarnessError(f"POST /api/workers/ answered {answer.status_code}")
                ids.append(answer.json()["id"])
        return list(Worker.objects.filter(public_id__in=ids))

    def delete(self, worker: Worker) -> int:
        with self.platform.api(self.key) as api:
            return api.delete(f"/api/workers/{worker.public_id}/").status_code

    def workers(self) -> list[Worker]:
        return all_workers()

    def statuses(self, workers: Iterable[Worker]) -> dict[str, str]:
        from workers_app.models import Worker

        ids = [w.pk for w in workers]
        return dict(Worker.objects.filter(pk__in=ids).values_list("public_id", "status"))

    def settled(self, *, queued: int, connected: int) -> tuple[list[Worker], list[Worker]]:
        """Workers requested in both environments, once the held ones are queued and the
        others connected (HarnessError if they do not get there)."""
        from workers_app.statuses import WorkerStatus

        held = self.request(HELD_ENVIRONMENT, queued)
        running = self.request(RUN_ENVIRONMENT, connected)
        if not (
            self.wait_status(held, {WorkerStatus.QUEUED}, timeout=90)
            and self.wait_status(running, {WorkerStatus.CONNECTED}, timeout=180)
        ):
            raise HarnessError(f"workers did not settle: {self.statuses(held + running)}")
        return held, running

    def wait_status(self, workers: list[Worker], wanted: set[str], timeout: float) -> bool:
        from workers_app.models import Worker

        ids = [w.pk for w in workers]
        return wait_until(
            lambda: Worker.objects.filter(pk__in=ids, status__in=wanted).count() == len(ids),
            timeout=timeout,
        )

    def changes_since(self, moment: datetime, workers: Iterable[Worker]) -> list[str]:
        """Status changes recorded for these workers since ``moment``, as readable lines."""
        from django.db.models import F

        from workers_app.models import WorkerEvent

        events = (
            WorkerEvent.objects.filter(worker__in=[w.pk for w in workers], at__gte=moment)
            .exclude(old_status=F("new_status"))
            .select_related("worker")
        )
        return [
            f"{e.worker.public_id}: {e.old_status} -> {e.new_status} ({e.reason})" for e in events
        ]

    def silent(self, workers: Iterable[Worker]) -> list[str]:
        """Workers whose heartbeat key was not refreshed in the last two intervals."""
        interval = self.knob("ACTIVATE_HEARTBEAT_INTERVAL")
        timeout = self.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
        client = self.platform.redis_client()
        return [
            w.public_id
            for w in workers
            if client.pttl(f"activate:hb:{w.pk}") <= (timeout - 2 * interval) * 1000
        ]

    def job_counts(self, workers: Iterable[Worker], *, all_states: bool = True) -> dict[str, int]:
        """Jobs per worker in squeue by its key (with all_states, ended ones not yet purged
        too). A task of an array made for these workers that no worker's key names is a second
        job of one of them: counted under its own key as two."""
        names = {w.public_id: job_name(w.public_id) for w in workers}
        keys = job_keys(names)
        counts = dict.fromkeys(keys.values(), 0)
        ours = tuple(f"{name}-" for name in names.values())
        for key in self.target.job_names(all_states=all_states):
            if key in counts:
                counts[key] += 1
            elif key.startswith(ours) and key.endswith("]"):
                counts[key] = 2
        return counts

    def job_ids(self, worker: Worker) -> list[str]:
        key = job_key(worker.public_id)
        return [i for i, n in self.target.jobs(all_states=True).items() if n == key]

    # -- clean-up ---------------------------------------------------------------------------

    def close(self) -> None:
        """Delete every live worker, wait for their jobs to go, stop the platform."""
        from workers_app.actions import deletion
        from workers_app.models import ApiKey, Worker
        from workers_app.statuses import LIVE

        names: list[str] = []
        try:
            names = list(job_keys(w.public_id for w in self.workers()).values())
            if "web" in self.platform.processes and "worker" in self.platform.processes:
                for worker in Worker.objects.filter(status__in=LIVE):
                    try:
                        self.delete(worker)
                    except Exception:
                        deletion.delete_worker(worker)
                wait_until(
                    lambda: not set(names) & set(self.target.job_names()), timeout=60, interval=1
                )
        finally:
            end_run(self.platform, self.target, names)
            ApiKey.objects.filter(user=self.owner).delete()


def submitting_processes(pids: Iterable[int]) -> dict[int, int]:
    """Workers whose submission holds its lock right now, each with the process among ``pids``
    that holds it: the one whose connection to PostgreSQL took the lock (its client port,
    found among the process's sockets)."""
    from django.db import connection

    from core.locks import LOCK_NAMESPACE

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.objid, a.client_port FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.classid = %s AND l.objsubid = 2",
            [LOCK_NAMESPACE],
        )
        # One connection holds the locks of every worker its batch submits.
        ports: dict[int, set[int]] = {}
        for worker, port in cursor.fetchall():
            if port:
                ports.setdefault(int(port), set()).add(int(worker))
    found = {}
    for pid in pids:
        try:
            # The process's own network namespace's sockets (a host cut off has its own).
            inodes = {}
            for table in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    if port in ports:
                        inodes[f"socket:[{fields[9]}]"] = ports[port]
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                for worker in inodes.get(os.readlink(fd), ()):
                    found[worker] = pid
        except OSError:
            continue
    return found


def mid_submission(worker_ids: Iterable[int]) -> QuerySet[Worker]:
    """Those of the workers in a submission's dangerous window: a submission commits the
    worker's agent secret just before its submit command runs and records the job after."""
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    return Worker.objects.filter(
        pk__in=list(worker_ids), status=WorkerStatus.PENDING, scheduler_job_id=""
    ).exclude(agent_secret_hash="")


@contextmanager
def recording_held(
    target: SshTarget, worker_ids: Iterable[int], *, timeout: float = 10
) -> Iterator[dict[int, str]]:
    """Catch submissions in their dangerous window: the job made, not yet recorded.

    A submission commits its worker's agent secret just before it runs sbatch, and records the
    job afterwards. Once a worker here has its secret and no job id, this locks its row
    (SELECT FOR UPDATE, in a transaction of its own), so the submission can make the job but
    not record it, and waits until squeue lists a job under the worker's name. Yields the
    workers caught so (pk -> the job id squeue lists), empty when none was; at exit the
    transaction ends (committing what the caller did in it) and held recordings go on.
    """
    from django.db import transaction

    submitting = mid_submission(worker_ids)
    wait_until(submitting.exists, timeout=timeout, interval=0.002)
    with transaction.atomic():
        # Rows a recording is writing now are passed over, never waited for: the recording
        # takes its rows in its own order, and waiting here for one of them while holding
        # another it wants is a deadlock.
        rows = submitting.order_by("pk").select_for_update(skip_locked=True)
        held = {w.job_key: w.pk for w in rows}
        caught: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while held and not caught and time.monotonic() < deadline:
            listed = target.jobs(all_states=True)
            caught = {held[name]: job_id for job_id, name in listed.items() if name in held}
            if not caught:
                time.sleep(0.02)
        yield caught


def unrecorded(caught: dict[int, str]) -> dict[int, str]:
    """Those of ``caught`` whose row still has no job id, read now."""
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    still = Worker.objects.filter(
        pk__in=list(caught), status=WorkerStatus.PENDING, scheduler_job_id=""
    ).values_list("pk", flat=True)
    return {pk: caught[pk] for pk in still}


def now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def pause(seconds: float) -> None:
    time.sleep(seconds)

"""Submission: 200 workers through the running platform against sbatch loops.

The platform side is real processes (web server, a Celery worker, beat): the clock starts at
one bulk POST /api/workers/ asking for all of them and stops when the last of the workers' jobs
is seen in squeue. Then single requests at a steady rate, for their latency. The
alternatives submit the same job script: through a new `ssh host sbatch` each time (the usual
portal way), and with local sbatch as the cluster account (the limit). Jobs are held, so 200 of
them do not swamp the node, and every job is cancelled at the end.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from bench.dask_peer import PeerRace, PeerScheduler, peer_python, race
from bench.report import Goal, Outcome, Table, millis, percentile, seconds, times
from harness import HarnessError
from harness.cells import cell
from harness.cluster import SshTarget, sshd_connections, testcluster
from harness.objects import (
    CLUSTER_NAME,
    HELD_ENVIRONMENT,
    HOLD_DIRECTIVE,
    forget_workers,
    job_keys,
    register_cluster,
    run_id,
    run_user,
    start_afresh,
)
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform
from harness.waiting import wait_until

if TYPE_CHECKING:
    from schedulers.base import JobSpec, SchedulerAdapter
    from workers_app.models import Environment, Worker

NAME = "submission"


@dataclass
class Way:
    label: str
    jobs: int
    elapsed: float
    connections: int
    commands_per_job: str
    notes: list[str] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.jobs / self.elapsed


class JobWatcher:
    """Notes when each job name is first listed (``listed``: job id -> name, all states where
    the scheduler keeps ended jobs), polling in a thread."""

    interval = 0.05

    def __init__(self, listed: Callable[[], dict[str, str]]) -> None:
        self.listed = listed
        self.first_seen: dict[str, float] = {}
        # job id -> (name, first seen): jobs that share one name (dask-jobqueue's) told apart.
        self.job_seen: dict[str, tuple[str, float]] = {}
        self.scans: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> JobWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                jobs = self.listed()
            except (subprocess.SubprocessError, ET.ParseError):
                jobs = {}
            seen_at = time.monotonic()
            self.scans.append(seen_at - started)
            for job_id, name in jobs.items():
                self.first_seen.setdefault(name, seen_at)
                self.job_seen.setdefault(job_id, (name, seen_at))
            self._stop.wait(self.interval)


@dataclass(frozen=True)
class Side:
    """One scheduler of the race: the platform's cluster on it, the directive that holds a job
    there, how its jobs are listed (and what lists them), and where the peer submits."""

    kind: str
    label: str
    cluster: str
    hold: str
    listed: Callable[[], dict[str, str]]
    lister: str
    peer: PeerScheduler
    # Brings the scheduler back to no job at all, ended ones included, before each round.
    emptied: Callable[[], None] = lambda: None


GRIDENGINE_CLUSTER = "bench-gridengine"


def _slurm_side(target: SshTarget) -> Side:
    return Side(
        "slurm",
        "Slurm",
        CLUSTER_NAME,
        HOLD_DIRECTIVE,
        lambda: target.jobs(all_states=True),
        "squeue --states=all",
        PeerScheduler("slurm", target.partition, target.cancel_names),
        # slurmctld keeps an ended job MinJobAge (600 s here) and refuses new ones past
        # MaxJobCount: five rounds of 4 x 1,000 reach it within minutes.
        lambda: testcluster("empty-slurmctld"),
    )


def _gridengine_side(target: SshTarget) -> Side:
    """The cell's Grid Engine as a cluster of its own, with a held environment like Slurm's."""
    from workers_app.models import Environment, EnvironmentField, FieldKind

    gridengine = cell("gridengine", target)
    cluster = register_cluster(target, GRIDENGINE_CLUSTER, scheduler="gridengine")
    environment, _ = Environment.objects.update_or_create(
        cluster=cluster,
        name=HELD_ENVIRONMENT,
        defaults={"partition": gridengine.queue, "is_active": True},
    )
    EnvironmentField.objects.update_or_create(
        environment=environment,
        name="walltime",
        defaults={"directive": "-l h_rt={value}", "default": "00:10:00", "position": 0},
    )
    EnvironmentField.objects.update_or_create(
        environment=environment,
        name="directives",
        defaults={
            "kind": FieldKind.DIRECTIVES,
            "default": gridengine.hold_directive,
            "position": 1,
        },
    )
    return Side(
        "gridengine",
        "Grid Engine",
        GRIDENGINE_CLUSTER,
        gridengine.hold_directive,
        lambda: gridengine.jobs(target.user),
        "qstat -xml -u",
        PeerScheduler(
            "gridengine",
            gridengine.queue,
            lambda names: gridengine.cancel_names(target.user, names),
        ),
    )


SIDES = {"slurm": _slurm_side, "gridengine": _gridengine_side}


def job_script() -> str:
    """The script the platform sends for a worker of the held environment (agent included)."""
    from workers_app.cluster_access import adapter_for
    from workers_app.models import Cluster

    adapter = adapter_for(Cluster.objects.get(name=CLUSTER_NAME))
    return adapter.render_script(_held_spec(type(adapter)))


def _held_spec(scheduler: type[SchedulerAdapter]) -> JobSpec:
    """The job of a new worker of the held environment, its secret included."""
    from workers_app.actions.jobs import job_spec
    from workers_app.agent_keys import issue_agent_key
    from workers_app.models import Environment

    environment = Environment.objects.get(cluster__name=CLUSTER_NAME, name=HELD_ENVIRONMENT)
    worker = _held_worker(environment, "bench-script", scheduler)
    return job_spec(worker, issue_agent_key(worker.public_id))


def _held_worker(environment: Environment, name: str, scheduler: type[SchedulerAdapter]) -> Worker:
    """An unsaved worker of the held environment with its job spec fixed, as a request does."""
    from workers_app.models import Worker
    from workers_app.params import directives_for, validate_params

    params = validate_params(environment, {}, scheduler=scheduler)
    return Worker(
        name=name,
        owner=run_user(),
        cluster=environment.cluster,
        environment=environment,
        params=params,
        job_partition=environment.partition,
        job_directives=directives_for(environment, params),
    )


def _local_loop(
    target: SshTarget, script: str, names: list[str], *, parallel: int = 1
) -> tuple[Way, list[str]]:
    """`sbatch` where the scheduler is, in ``parallel`` shells at once (the names dealt out in
    turn), as the platform runs SUBMIT_PARALLEL commands at once."""
    with tempfile.TemporaryDirectory(prefix="bench-sbatch-") as tmp:
        path = Path(tmp) / "job.sh"
        path.write_text(script)
        Path(tmp).chmod(0o755)
        path.chmod(0o644)
        lines = [f"sbatch --parsable --job-name={name} < {path}" for name in names]
        shares = [lines[i::parallel] for i in range(parallel)]
        connections = sshd_connections()
        started = time.perf_counter()
        with ThreadPoolExecutor(parallel) as pool:
            ids = [i for share in pool.map(target.sbatch_locally, shares) for i in share]
        elapsed = time.perf_counter() - started
    label = (
        "local sbatch loop, one after the other"
        if parallel == 1
        else f"local sbatch, {parallel} loops at once (the platform's parallelism: the limit)"
    )
    way = Way(label, len(names), elapsed, sshd_connections() - connections, "1")
    return way, ids


def _local_array(target: SshTarget, script: str, name: str, count: int) -> tuple[Way, list[str]]:
    """One `sbatch --array` where the scheduler is: every job a task of one array, the fewest
    submissions there can be (the platform sends a bulk as arrays of up to ARRAY_TASKS)."""
    with tempfile.TemporaryDirectory(prefix="bench-sbatch-") as tmp:
        path = Path(tmp) / "job.sh"
        path.write_text(script)
        Path(tmp).chmod(0o755)
        path.chmod(0o644)
        line = f"sbatch --parsable --job-name={name} --array=0-{count - 1} < {path}"
        connections = sshd_connections()
        started = time.perf_counter()
        ids = target.sbatch_locally([line])
        elapsed = time.perf_counter() - started
    label = "one local sbatch --array of every job (the limit of arrays)"
    return Way(label, count, elapsed, sshd_connections() - connections, f"{1 / count:.3f}"), ids


def _ssh_loop(
    target: SshTarget, script: str, names: list[str], *, multiplexed: bool = False
) -> tuple[Way, list[str]]:
    """`ssh host sbatch` once per job: a new connection each, or, ``multiplexed``, over one
    master connection (ControlMaster=auto, as a careful user configures OpenSSH)."""
    ids: list[str] = []
    control = Path(tempfile.mkdtemp(prefix="bench-ssh-")) if multiplexed else None
    connections = sshd_connections()
    started = time.perf_counter()
    for name in names:
        result = subprocess.run(
            target.ssh_argv("sbatch", "--parsable", f"--job-name={name}", control_dir=control),
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            target.cancel_ids(ids)
            raise HarnessError(f"ssh sbatch failed: {result.stderr.strip()[:300]}")
        ids.append(result.stdout.strip().split(";")[0])
    elapsed = time.perf_counter() - started
    opened = sshd_connections() - connections
    if control is not None:
        target.close_master(control)
    label = (
        "`ssh host sbatch` loop, one multiplexed connection (ControlMaster=auto)"
        if multiplexed
        else "`ssh host sbatch` loop, new connection each"
    )
    return Way(label, len(names), elapsed, opened, "1"), ids


@dataclass
class SubmitCost:
    empty_command: float
    commands_per_submit: float
    find_job: float
    sbatch: float
    submit_worker: float
    batch_size: int = 0
    batch_per_job: float = 0.0
    batch_commands: int = 0


def _submit_cost(target: SshTarget, tag: str, count: int, batch_size: int) -> SubmitCost:
    """In-process, over the kept connection: the name lookup, sbatch, a whole submission, and a
    batch of workers submitted together."""
    from core.transport.connection import commands_run_total
    from workers_app.actions.jobs import submit_worker, submit_workers
    from workers_app.cluster_access import adapter_for
    from workers_app.models import Cluster, Environment, Worker

    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    adapter = adapter_for(cluster)
    adapter.find_job(f"{tag}-warm")  # opens the connection
    ids: list[str] = []
    try:
        started = time.perf_counter()
        for _ in range(count):
            adapter.runner.run(["true"])
        empty = (time.perf_counter() - started) / count
        started = time.perf_counter()
        for i in range(count):
            adapter.find_job(f"{tag}-absent-{i}")
        find_job = (time.perf_counter() - started) / count
        started = time.perf_counter()
        spec = _held_spec(type(adapter))
        for i in range(count):
            ids.append(adapter.submit(replace(spec, name=f"{tag}-direct-{i}")))
        sbatch = (time.perf_counter() - started) / count
        environment = Environment.objects.get(cluster=cluster, name=HELD_ENVIRONMENT)
        workers = [_held_worker(environment, f"{tag}-{i}", type(adapter)) for i in range(count)]
        for worker in workers:
            worker.save()
        before = commands_run_total()
        started = time.perf_counter()
        for worker in workers:
            outcome = submit_worker(worker.pk)
            if not outcome.startswith("submitted"):
                raise HarnessError(f"in-process submission failed: {outcome}")
        whole = (time.perf_counter() - started) / count
        commands = (commands_run_total() - before) / count
        for worker in workers:
            worker.refresh_from_db()
            ids.append(worker.scheduler_job_id)
        batch = [_held_worker(environment, f"{tag}-b{i}", type(adapter)) for i in range(batch_size)]
        Worker.objects.bulk_create(batch)
        before = commands_run_total()
        started = time.perf_counter()
        outcomes = submit_workers([worker.pk for worker in batch])
        batch_time = time.perf_counter() - started
        batch_commands = commands_run_total() - before
        for worker in batch:
            worker.refresh_from_db()
            ids.append(worker.scheduler_job_id)
        if not all(o.startswith("submitted") for o in outcomes.values()):
            raise HarnessError(f"in-process batch submission failed: {set(outcomes.values())}")
    finally:
        target.cancel_ids([job_id for job_id in ids if job_id])
        forget_workers()
    return SubmitCost(
        empty,
        commands,
        find_job,
        sbatch,
        whole,
        batch_size,
        batch_time / batch_size,
        batch_commands,
    )


Race = tuple[Side, Way, PeerRace]


def _platform(
    sides: list[Side],
    counts: tuple[int, ...],
    peer: Callable[[Side, int], PeerRace],
    *,
    repetitions: int,
    celery_concurrency: int,
    post_concurrency: int,
    post_rate: float,
    post_count: int,
) -> tuple[list[Race], list[float]]:
    """For each scheduler and count, ``repetitions`` times: the peer's race, the platform's
    twice, the peer's again (the platform up but idle during the peer's, so both see the same
    machine); then single POSTs (to the first scheduler's cluster) for their latency."""
    from workers_app.actions.requests import BULK_MAX
    from workers_app.models import ApiKey, Worker
    from workers_app.statuses import FINISHED, WorkerStatus

    user = run_user()
    _, key = ApiKey.issue(user, name="bench")
    workdir = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    knobs = {
        **PRODUCTION_KNOBS,
        **NO_RECONCILE,
        "ACTIVATE_CELERY_CONCURRENCY": str(celery_concurrency),
    }
    platform = Platform(workdir=workdir, knobs=knobs)
    bodies = {
        side.kind: {"cluster": side.cluster, "environment": HELD_ENVIRONMENT, "params": {}}
        for side in sides
    }
    body = bodies[sides[0].kind]
    local = threading.local()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = platform.api(key)
        made: httpx.Client = local.client
        return made

    def post(_: int) -> tuple[str, float]:
        started = time.perf_counter()
        response = client().post("/api/workers/", json=body)
        if response.status_code != 201:
            raise HarnessError(f"POST /api/workers/ answered {response.status_code}")
        return response.json()["id"], time.perf_counter() - started

    def post_bulk(side: Side, count: int) -> tuple[list[str], float]:
        started = time.monotonic()
        asked = {**bodies[side.kind], "count": count}
        answer = client().post("/api/workers/", json=asked, timeout=120)
        if answer.status_code != 201:
            raise HarnessError(f"bulk POST /api/workers/ answered {answer.status_code}")
        return [w["id"] for w in answer.json()["workers"]], time.monotonic() - started

    def delete_all() -> None:
        public_ids = list(
            Worker.objects.exclude(status__in=FINISHED).values_list("public_id", flat=True)
        )
        with platform.api(key) as api, ThreadPoolExecutor(post_concurrency) as pool:
            list(pool.map(lambda p: api.delete(f"/api/workers/{p}/"), public_ids))
        _wait_all_finished(timeout=300)

    def bulk(side: Side, count: int) -> Way:
        # A request makes at most BULK_MAX workers: more go as several requests at once.
        sizes = [min(BULK_MAX, count - start) for start in range(0, count, BULK_MAX)]
        connections = sshd_connections()
        with JobWatcher(side.listed) as watcher, ThreadPoolExecutor(len(sizes)) as pool:
            started = time.monotonic()
            answers = list(pool.map(lambda size: post_bulk(side, size), sizes))
            public_ids = [public_id for ids, _ in answers for public_id in ids]
            # A worker's job is known by its key once recorded (a task of an array has its
            # array's name); the watcher notes when each key was first listed meanwhile.
            recorded = Worker.objects.filter(public_id__in=public_ids, status=WorkerStatus.PENDING)
            wait_until(lambda: not recorded.exists(), timeout=300, interval=0.2)
            names = set(job_keys(public_ids).values())
            if not wait_until(lambda: names <= watcher.first_seen.keys(), timeout=300):
                missing = len(names - watcher.first_seen.keys())
                raise HarnessError(f"{missing} of {count} jobs never listed by {side.lister}")
            elapsed = max(watcher.first_seen[name] for name in names) - started
            first = min(watcher.first_seen[name] for name in names) - started
            scan = statistics.median(watcher.scans)
        opened = sshd_connections() - connections
        # Until every worker is recorded queued, so that the next run starts on a quiet platform.
        wait_until(
            lambda: not Worker.objects.filter(status=WorkerStatus.PENDING).exists(), timeout=300
        )
        counts = _job_counts(side, names)
        duplicated = sum(1 for n in counts.values() if n > 1)
        requests = (
            f"one bulk POST (count={count})"
            if len(sizes) == 1
            else f"{len(sizes)} bulk POSTs at once (count={'+'.join(map(str, sizes))}: "
            f"a request makes at most {BULK_MAX})"
        )
        answered = max(took for _, took in answers)
        return Way(
            f"platform: {count} workers, {requests}",
            count,
            elapsed,
            opened,
            "",
            notes=[
                f"{side.label}, {count}: {requests} answered in {seconds(answered)}; the first "
                f"job listed after {seconds(first)}; new SSH connections {opened}; jobs per "
                f"worker in {side.lister}: duplicated {duplicated}, missing "
                f"{sum(1 for n in counts.values() if n == 0)}; median scan {millis(scan)}",
            ],
        )

    try:
        platform.start_deployed_web(workers=2, threads=4)
        platform.start_worker()
        platform.start_sweeper()
        platform.start_beat()
        # Warm-up: every Celery process opens its kept SSH connections, as in steady state.
        with ThreadPoolExecutor(post_concurrency) as pool:
            warm = 2 * celery_concurrency
            for side in sides:
                list(pool.map(post_bulk, [side] * warm, [1] * warm))
        wait_until(
            lambda: not Worker.objects.filter(status=WorkerStatus.PENDING).exists(), timeout=120
        )
        delete_all()
        races = []
        for side, count in itertools.product(sides, counts):
            theirs: list[PeerRace] = []
            ours: list[Way] = []
            for _ in range(repetitions):
                # Each round on an empty controller; then peer, platform, platform, peer: it
                # keeps every job it was given for a while and slows as they pile up, so
                # whoever went first is favoured.
                side.emptied()
                for run in ("peer", "ours", "ours", "peer"):
                    if run == "peer":
                        theirs.append(peer(side, count))
                        took = theirs[-1].elapsed
                    else:
                        ours.append(bulk(side, count))
                        took = ours[-1].elapsed
                        delete_all()
                    who = "dask-jobqueue" if run == "peer" else "platform"
                    print(f"  {side.label}, {who}, {count} jobs: {took:.2f} s", flush=True)
            races.append((side, *_both_runs(ours, theirs)))
        latencies = _steady_posts(post, rate=post_rate, count=post_count, threads=post_concurrency)
        delete_all()
        return races, latencies
    finally:
        platform.stop_all()
        names = set(job_keys(Worker.objects.values_list("public_id", flat=True)).values())
        for side in sides:
            side.peer.cancel_names(names)
        forget_workers()
        ApiKey.objects.filter(user=user).delete()


def _both_runs(ours: list[Way], theirs: list[PeerRace]) -> tuple[Way, PeerRace]:
    """Each side's runs as one: their mean time, and each run's in the notes."""
    rounds = [
        f"{seconds(theirs[2 * i].elapsed)}, {seconds(ours[2 * i].elapsed)}, "
        f"{seconds(ours[2 * i + 1].elapsed)}, {seconds(theirs[2 * i + 1].elapsed)}"
        for i in range(len(theirs) // 2)
    ]
    runs = (
        f"{ours[0].jobs}: {len(rounds)} x (dask-jobqueue then the platform twice then "
        f"dask-jobqueue): {'; '.join(rounds)}; each side's mean is compared"
    )
    mean = replace(
        ours[0],
        elapsed=statistics.mean(w.elapsed for w in ours),
        notes=[runs, *(note for way in ours for note in way.notes)],
    )
    return mean, replace(theirs[0], elapsed=statistics.mean(r.elapsed for r in theirs))


def _steady_posts(
    post: Callable[[int], tuple[str, float]], *, rate: float, count: int, threads: int
) -> list[float]:
    """Single POSTs at a steady rate (open loop): each latency counts from when it was due."""
    started = time.perf_counter()

    def due_post(i: int) -> float:
        due = started + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        post(i)
        return time.perf_counter() - due

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(due_post, range(count)))


def _wait_all_finished(*, timeout: float) -> bool:
    from workers_app.models import Worker
    from workers_app.statuses import LIVE

    return wait_until(lambda: not Worker.objects.filter(status__in=LIVE).exists(), timeout=timeout)


def _job_counts(side: Side, names: set[str]) -> dict[str, int]:
    counts = dict.fromkeys(names, 0)
    for name in side.listed().values():
        if name in counts:
            counts[name] += 1
    return counts


@dataclass
class References:
    """The loops the platform is compared with besides dask-jobqueue, and its own costs."""

    others: list[Way]  # the ssh loop, the multiplexed one, the serial local loop, one array
    local: Way  # local sbatch with the platform's parallelism
    cost: SubmitCost
    script_size: int


def _references(target: SshTarget, tag: str, count: int, cost_samples: int) -> References:
    from schedulers.slurm import SUBMIT_PARALLEL

    script = job_script()
    cost = _submit_cost(target, f"{tag}-cost", cost_samples, count)
    serial, ids = _local_loop(target, script, [f"{tag}-serial-{i}" for i in range(count)])
    target.cancel_ids(ids)
    print(f"  local sbatch loop: {serial.elapsed:.2f} s", flush=True)
    local, ids = _local_loop(
        target, script, [f"{tag}-local-{i}" for i in range(count)], parallel=SUBMIT_PARALLEL
    )
    target.cancel_ids(ids)
    print(f"  local sbatch, {SUBMIT_PARALLEL} at once: {local.elapsed:.2f} s", flush=True)
    ssh, ids = _ssh_loop(target, script, [f"{tag}-ssh-{i}" for i in range(count)])
    target.cancel_ids(ids)
    print(f"  ssh sbatch loop: {ssh.elapsed:.2f} s", flush=True)
    muxed, ids = _ssh_loop(
        target, script, [f"{tag}-mux-{i}" for i in range(count)], multiplexed=True
    )
    target.cancel_ids(ids)
    print(f"  ssh sbatch loop, multiplexed: {muxed.elapsed:.2f} s", flush=True)
    array, ids = _local_array(target, script, f"{tag}-array", count)
    target.cancel_ids(ids)
    print(f"  one local sbatch --array: {array.elapsed:.2f} s", flush=True)
    return References([ssh, muxed, serial, array], local, cost, len(script))


def run(
    target: SshTarget,
    *,
    counts: tuple[int, ...] = (200, 1000),
    schedulers: tuple[str, ...] = ("slurm", "gridengine"),
    repetitions: int = 5,
    references: bool = True,
    celery_concurrency: int = 4,
    post_concurrency: int = 8,
    cost_samples: int = 20,
    post_rate: float = 20.0,
    post_count: int = 200,
) -> Outcome:
    if not counts:
        raise HarnessError("--submit-counts names no count")
    if repetitions < 1:
        raise HarnessError("--submit-repetitions must be at least 1")
    unknown = set(schedulers) - SIDES.keys()
    if not schedulers or unknown:
        raise HarnessError(f"--submit-schedulers: one or more of {', '.join(SIDES)}")
    python, version = peer_python(target)
    start_afresh(target)
    sides = [SIDES[kind](target) for kind in schedulers]
    tag = f"bench-sub-{run_id()}"
    loops = _references(target, tag, counts[0], cost_samples) if references else None
    races_run = itertools.count(1)

    def peer(side: Side, jobs: int) -> PeerRace:
        # A name of each race's own: the watcher lists the earlier race's jobs too (cancelled).
        name = f"{tag}-dask-{jobs}-{next(races_run)}"
        with JobWatcher(side.listed) as watcher:
            return race(
                target,
                python,
                version,
                watcher.job_seen,
                scheduler=side.peer,
                jobs=jobs,
                job_name=name,
                directive=side.hold,
            )

    races, latencies = _platform(
        sides,
        counts,
        peer,
        repetitions=repetitions,
        celery_concurrency=celery_concurrency,
        post_concurrency=post_concurrency,
        post_rate=post_rate,
        post_count=post_count,
    )
    notes = [
        f"web: as scripts/start.sh web runs it (production settings); Celery worker "
        f"concurrency {celery_concurrency}; {2 * celery_concurrency} warm-up workers submitted "
        "first to each cluster so each Celery process has its kept SSH connections open, as in "
        "steady state",
        "new SSH connections: counted in the test sshd's log over each way's run",
        f"the end is seen by listing the account's jobs every {JobWatcher.interval:g} s "
        f"({', '.join(side.lister for side in sides)}): up to a scan late, for every way alike",
    ]
    return _outcome(races, loops, latencies, post_rate, notes)


def _compare(ours: float, other: float) -> str:
    if ours <= other:
        return f"{times(other / ours)} faster"
    return f"{times(ours / other)} slower"


# Against dask-jobqueue (issue 39): on Slurm, from this many jobs on, the platform's rate at
# least this multiple of its; below it, and on Grid Engine, at least level.
PEER_AHEAD_FROM = 1000
PEER_AHEAD_BY = 1.2


def _peer_floor(side: Side, jobs: int) -> float:
    return PEER_AHEAD_BY if side.kind == "slurm" and jobs >= PEER_AHEAD_FROM else 1.0


def _outcome(
    races: list[Race],
    loops: References | None,
    latencies: list[float],
    post_rate: float,
    notes: list[str],
) -> Outcome:
    from schedulers import gridengine, slurm

    peers = Table(
        "Submission against dask-jobqueue (same run): held jobs, from the call to the last "
        "job listed",
        [
            "scheduler",
            "jobs",
            "platform",
            "platform jobs/s",
            "dask-jobqueue",
            "dask jobs/s",
            "platform/dask",
        ],
        align="lrrrrrr",
    )
    goals = []
    for side, ours, theirs in races:
        ratio = ours.per_second / (theirs.jobs / theirs.elapsed)
        peers.add(
            side.label,
            ours.jobs,
            seconds(ours.elapsed),
            f"{ours.per_second:.1f}",
            seconds(theirs.elapsed),
            f"{theirs.jobs / theirs.elapsed:.1f}",
            f"{ratio:.2f}x",
        )
        floor = _peer_floor(side, ours.jobs)
        goals.append(
            Goal(
                NAME,
                f"{side.label}, {ours.jobs} workers: jobs/s at least {floor:g}x dask-jobqueue's",
                f"{ours.per_second:.1f} vs {theirs.jobs / theirs.elapsed:.1f} jobs/s "
                f"({ratio:.2f}x)",
                ratio >= floor,
            )
        )
        peers.notes += ours.notes
    for side in dict.fromkeys(side for side, _, _ in races):
        peers.notes += next(theirs for s, _, theirs in races if s is side).notes
    peers.notes.append(
        "the platform: each bulk request is one Celery task; on Slurm its jobs go as job arrays "
        f"of up to {slurm.ARRAY_TASKS} tasks, {slurm.ARRAY_PARALLEL} at once, each one command "
        "on the kept SSH connection (every task's environment file, then one sbatch --array; "
        "schedulers/slurm.py); on Grid Engine in chunks of up to "
        f"{gridengine.SUBMIT_CHUNK} jobs per command, {gridengine.SUBMIT_PARALLEL} commands at "
        "once, one qsub a job, the agent every script ends with sent once a command; each "
        "command started once its own jobs' agent keys are committed"
    )
    p95 = percentile(latencies, 95)
    goals.append(
        Goal(
            NAME,
            f"single POST /api/workers/ p95 < 50 ms at {post_rate:g} requests/s",
            millis(p95),
            p95 < 0.05,
        )
    )
    peers.notes += notes
    peers.notes.append(
        f"single POST /api/workers/ at {post_rate:g}/s (open loop, {len(latencies)} requests, "
        f"each submitted as it comes): p50 {millis(percentile(latencies, 50))}, "
        f"p95 {millis(p95)}, max {millis(max(latencies))}"
    )
    slurm_races = [(ours, theirs) for side, ours, theirs in races if side.kind == "slurm"]
    if loops is None or not slurm_races:
        return Outcome([peers], goals)
    tables, more = _against_loops(slurm_races[0], loops)
    return Outcome([peers, *tables], goals + more)


def _against_loops(race: tuple[Way, PeerRace], loops: References) -> tuple[list[Table], list[Goal]]:
    """The platform's first size against the loops of the same script, and its costs."""
    from schedulers.slurm import SUBMIT_PARALLEL

    others, local, cost, script_size = loops.others, loops.local, loops.cost, loops.script_size
    ours, dask = race
    table = Table(
        f"Submission: {ours.jobs} held jobs, from the first request to the last job in squeue",
        [
            "way",
            "jobs",
            "time",
            "jobs/s",
            "new SSH connections",
            "commands per job",
            "the platform is",
        ],
        align="lrrrrrr",
    )
    ours.commands_per_job = (
        f"{cost.batch_commands / max(cost.batch_size, 1):.3f} ({cost.batch_commands} for "
        f"{cost.batch_size}, measured in-process)"
    )
    ssh, muxed = others[0], others[1]
    for way in (ours, *others, local):
        table.add(
            way.label,
            way.jobs,
            seconds(way.elapsed),
            f"{way.per_second:.1f}",
            way.connections,
            way.commands_per_job,
            "-" if way is ours else _compare(ours.elapsed, way.elapsed),
        )
    table.add(
        "dask-jobqueue SLURMCluster.scale(jobs=N), local, every sbatch at once",
        dask.jobs,
        seconds(dask.elapsed),
        f"{dask.jobs / dask.elapsed:.1f}",
        0,
        "1",
        _compare(ours.elapsed, dask.elapsed),
    )
    table.notes += [
        f"the loops submit the same {script_size}-byte script (the platform's, agent "
        f"included), with {HOLD_DIRECTIVE}; the ssh loops run one sbatch after the other; "
        f"the limit of one sbatch a job runs {SUBMIT_PARALLEL} local loops at once; the limit "
        "of arrays is one local sbatch --array of them all; dask-jobqueue submits its own "
        "worker script, with the same directive.",
    ]
    costs = Table(
        "What one submission costs over the kept SSH connection (in-process, serial)",
        ["step", "mean time"],
    )
    costs.add(
        "an empty command (`true`): one channel on the kept connection", millis(cost.empty_command)
    )
    costs.add("name lookup for idempotency (`squeue --name`, find_job)", millis(cost.find_job))
    costs.add("`sbatch --parsable` with the script on stdin", millis(cost.sbatch))
    costs.add(
        f"whole jobs.submit_worker ({cost.commands_per_submit:g} commands measured)",
        millis(cost.submit_worker),
    )
    costs.add(
        f"jobs.submit_workers, {cost.batch_size} workers together ({cost.batch_commands} "
        "commands), per job",
        millis(cost.batch_per_job),
    )
    costs.add("local sbatch, per job (from the local loop)", millis(local.elapsed / local.jobs))
    costs.notes.append(
        "the lookup lets a redelivered task or a timed-out sbatch adopt the existing job "
        "instead of making a second one; it runs only on a retry (an earlier attempt wrote the "
        "worker's agent secret before its sbatch), so a first attempt is sbatch alone."
    )
    goals = [
        Goal(
            NAME,
            f"{ours.jobs} workers from one bulk request: >= 100 jobs/s",
            f"{ours.per_second:.1f} jobs/s",
            ours.per_second >= 100,
        ),
        Goal(
            NAME,
            "faster than the `ssh host sbatch` loop, multiplexed as a careful user would",
            f"{times(muxed.elapsed / ours.elapsed)} (new connection each: "
            f"{times(ssh.elapsed / ours.elapsed)})",
            ours.elapsed < muxed.elapsed,
        ),
        Goal(
            NAME,
            f"within 2x of local sbatch with the same parallelism ({SUBMIT_PARALLEL} at once)",
            f"{ours.elapsed / local.elapsed:.2f}x its time",
            ours.elapsed <= 2 * local.elapsed,
        ),
    ]
    return [table, costs], goals

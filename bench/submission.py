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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from bench.dask_peer import PeerRace, peer_python, race
from bench.report import Goal, Outcome, Table, millis, percentile, seconds, times
from harness import HarnessError
from harness.cluster import SshTarget, sshd_connections
from harness.objects import (
    CLUSTER_NAME,
    HELD_ENVIRONMENT,
    HOLD_DIRECTIVE,
    forget_workers,
    job_name,
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


class SqueueWatcher:
    """Notes when each job name first shows in squeue (all states), polling in a thread."""

    interval = 0.05

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.first_seen: dict[str, float] = {}
        # job id -> (name, first seen): jobs that share one name (dask-jobqueue's) told apart.
        self.job_seen: dict[str, tuple[str, float]] = {}
        self.scans: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SqueueWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                jobs = self.target.jobs(all_states=True)
            except subprocess.SubprocessError:
                jobs = {}
            seen_at = time.monotonic()
            self.scans.append(seen_at - started)
            for job_id, name in jobs.items():
                self.first_seen.setdefault(name, seen_at)
                self.job_seen.setdefault(job_id, (name, seen_at))
            self._stop.wait(self.interval)


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


def _platform(
    target: SshTarget,
    counts: tuple[int, ...],
    peer: Callable[[int], PeerRace],
    *,
    celery_concurrency: int,
    post_concurrency: int,
    post_rate: float,
    post_count: int,
) -> tuple[list[tuple[Way, PeerRace]], list[float]]:
    """For each count: the peer's race, the platform's twice, the peer's again (the platform up
    but idle during the peer's, so both see the same machine); then single POSTs for their
    latency."""
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
    body = {"cluster": CLUSTER_NAME, "environment": HELD_ENVIRONMENT, "params": {}}
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

    def post_bulk(count: int) -> tuple[list[str], float]:
        started = time.monotonic()
        answer = client().post("/api/workers/", json={**body, "count": count}, timeout=120)
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

    def bulk(count: int) -> Way:
        # A request makes at most BULK_MAX workers: more go as several requests at once.
        sizes = [min(BULK_MAX, count - start) for start in range(0, count, BULK_MAX)]
        connections = sshd_connections()
        with SqueueWatcher(target) as watcher, ThreadPoolExecutor(len(sizes)) as pool:
            started = time.monotonic()
            answers = list(pool.map(post_bulk, sizes))
            names = {job_name(public_id) for ids, _ in answers for public_id in ids}
            if not wait_until(lambda: names <= watcher.first_seen.keys(), timeout=300):
                missing = len(names - watcher.first_seen.keys())
                raise HarnessError(f"{missing} of {count} jobs never showed in squeue")
            elapsed = max(watcher.first_seen[name] for name in names) - started
            first = min(watcher.first_seen[name] for name in names) - started
            scan = statistics.median(watcher.scans)
        opened = sshd_connections() - connections
        # Until every worker is recorded queued, so that the next run starts on a quiet platform.
        wait_until(
            lambda: not Worker.objects.filter(status=WorkerStatus.PENDING).exists(), timeout=300
        )
        counts = _job_counts(target, names)
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
                f"{count}: {requests} answered in {seconds(answered)}; the first job seen in "
                f"squeue after {seconds(first)}; new SSH connections "
                f"{opened}; jobs per worker in squeue --states=all: duplicated {duplicated}, "
                f"missing {sum(1 for n in counts.values() if n == 0)}; median squeue scan "
                f"{millis(scan)}",
            ],
        )

    try:
        platform.start_deployed_web(workers=2, threads=4)
        platform.start_worker()
        platform.start_sweeper()
        platform.start_beat()
        # Warm-up: every Celery process opens its kept SSH connection, as in steady state.
        with ThreadPoolExecutor(post_concurrency) as pool:
            list(pool.map(post, range(2 * celery_concurrency)))
        wait_until(
            lambda: not Worker.objects.filter(status=WorkerStatus.PENDING).exists(), timeout=120
        )
        delete_all()
        races = []
        for count in counts:
            # Peer, platform, platform, peer: the controller keeps every job it was given for
            # MinJobAge and slows as they pile up, so whoever went first would be favoured.
            theirs = [peer(count)]
            print(f"  dask-jobqueue, {count} jobs: {theirs[0].elapsed:.2f} s", flush=True)
            ours = []
            for _ in range(2):
                ours.append(bulk(count))
                print(f"  platform, {count} workers: {ours[-1].elapsed:.2f} s", flush=True)
                delete_all()
            theirs.append(peer(count))
            print(f"  dask-jobqueue, {count} jobs: {theirs[1].elapsed:.2f} s", flush=True)
            races.append(_both_runs(ours, theirs))
        latencies = _steady_posts(post, rate=post_rate, count=post_count, threads=post_concurrency)
        delete_all()
        return races, latencies
    finally:
        platform.stop_all()
        names = {job_name(p) for p in Worker.objects.values_list("public_id", flat=True)}
        target.cancel_names(names)
        forget_workers()
        ApiKey.objects.filter(user=user).delete()


def _both_runs(ours: list[Way], theirs: list[PeerRace]) -> tuple[Way, PeerRace]:
    """Each side's two runs as one: their mean time, and each run's in the notes."""
    order = [theirs[0].elapsed, *(way.elapsed for way in ours), theirs[1].elapsed]
    runs = (
        f"{ours[0].jobs}: dask-jobqueue then the platform twice then dask-jobqueue: "
        f"{', '.join(seconds(took) for took in order)}; each side's mean is compared"
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


def _job_counts(target: SshTarget, names: set[str]) -> dict[str, int]:
    counts = dict.fromkeys(names, 0)
    for name in target.job_names(all_states=True):
        if name in counts:
            counts[name] += 1
    return counts


def run(
    target: SshTarget,
    *,
    counts: tuple[int, ...] = (200, 1000),
    celery_concurrency: int = 4,
    post_concurrency: int = 8,
    cost_samples: int = 20,
    post_rate: float = 20.0,
    post_count: int = 200,
) -> Outcome:
    from schedulers.slurm import SUBMIT_PARALLEL

    if not counts:
        raise HarnessError("--submit-counts names no count")
    count = counts[0]
    python, version = peer_python(target)
    start_afresh(target)
    script = job_script()
    tag = f"bench-sub-{run_id()}"
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

    races_run = itertools.count(1)

    def peer(jobs: int) -> PeerRace:
        # A name of each race's own: the watcher lists the earlier race's jobs too (cancelled).
        name = f"{tag}-dask-{jobs}-{next(races_run)}"
        with SqueueWatcher(target) as watcher:
            return race(
                target,
                python,
                version,
                watcher.job_seen,
                jobs=jobs,
                job_name=name,
                directive=HOLD_DIRECTIVE,
            )

    races, latencies = _platform(
        target,
        counts,
        peer,
        celery_concurrency=celery_concurrency,
        post_concurrency=post_concurrency,
        post_rate=post_rate,
        post_count=post_count,
    )
    notes = [
        f"web: as scripts/start.sh web runs it (production settings); Celery worker "
        f"concurrency {celery_concurrency}; {2 * celery_concurrency} warm-up workers submitted "
        "first so each Celery process has its kept SSH connection open, as in steady state",
        "new SSH connections: counted in the test sshd's log over each way's run",
        f"the end is seen by polling squeue (all states) every {SqueueWatcher.interval:g} s: "
        "up to a scan late, for every way alike",
    ]
    return _outcome(
        races, [ssh, muxed, serial], local, latencies, cost, len(script), post_rate, notes
    )


def _compare(ours: float, other: float) -> str:
    if ours <= other:
        return f"{times(other / ours)} faster"
    return f"{times(ours / other)} slower"


# Against dask-jobqueue: from this many jobs on the platform must be at least as fast; below it,
# where its fixed costs (the request, the database, Celery, SSH) weigh, within this factor.
PEER_AT_LEAST_FROM = 1000
PEER_SMALL_FACTOR = 1.3


def _outcome(
    races: list[tuple[Way, PeerRace]],
    others: list[Way],
    local: Way,
    latencies: list[float],
    cost: SubmitCost,
    script_size: int,
    post_rate: float,
    notes: list[str],
) -> Outcome:
    from schedulers.slurm import SUBMIT_CHUNK, SUBMIT_PARALLEL

    peers = Table(
        "Submission against dask-jobqueue (same run): held jobs, from the call to the last "
        "job in squeue",
        ["jobs", "platform", "platform jobs/s", "dask-jobqueue", "dask jobs/s", "platform/dask"],
        align="rrrrrr",
    )
    goals = []
    for ours, theirs in races:
        ratio = ours.per_second / (theirs.jobs / theirs.elapsed)
        peers.add(
            ours.jobs,
            seconds(ours.elapsed),
            f"{ours.per_second:.1f}",
            seconds(theirs.elapsed),
            f"{theirs.jobs / theirs.elapsed:.1f}",
            f"{ratio:.2f}x",
        )
        at_least = ours.jobs >= PEER_AT_LEAST_FROM
        floor = 1.0 if at_least else 1 / PEER_SMALL_FACTOR
        goals.append(
            Goal(
                NAME,
                f"{ours.jobs} workers: jobs/s "
                + (
                    "at least dask-jobqueue's"
                    if at_least
                    else f"within {PEER_SMALL_FACTOR:g}x of dask-jobqueue's"
                ),
                f"{ours.per_second:.1f} vs {theirs.jobs / theirs.elapsed:.1f} jobs/s "
                f"({ratio:.2f}x)",
                ratio >= floor,
            )
        )
        peers.notes += ours.notes
    peers.notes += races[0][1].notes
    peers.notes.append(
        f"the platform: each bulk request is one Celery task; it sends the jobs in chunks of up "
        f"to {SUBMIT_CHUNK} per command, {SUBMIT_PARALLEL} commands at once on its kept SSH "
        "connection (schedulers/slurm.py)"
    )
    ours = races[0][0]
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
    dask = races[0][1]
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
    table.notes += notes
    table.notes += [
        f"single POST /api/workers/ at {post_rate:g}/s (open loop, {len(latencies)} requests, "
        f"each submitted as it comes): p50 {millis(percentile(latencies, 50))}, "
        f"p95 {millis(percentile(latencies, 95))}, max {millis(max(latencies))}",
        f"the loops submit the same {script_size}-byte script (the platform's, agent "
        f"included), with {HOLD_DIRECTIVE}; the ssh loops run one sbatch after the other; "
        f"the limit runs {SUBMIT_PARALLEL} local loops at once, as the platform runs "
        f"{SUBMIT_PARALLEL} sbatch commands at once; dask-jobqueue submits its own worker "
        "script, with the same directive.",
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
    p95 = percentile(latencies, 95)
    goals += [
        Goal(
            NAME,
            f"{ours.jobs} workers from one bulk request: >= 100 jobs/s",
            f"{ours.per_second:.1f} jobs/s",
            ours.per_second >= 100,
        ),
        Goal(
            NAME,
            f"single POST /api/workers/ p95 < 50 ms at {post_rate:g} requests/s",
            millis(p95),
            p95 < 0.05,
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
    return Outcome([peers, table, costs], goals)

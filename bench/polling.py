"""Status polling: our poll cycle against one `ssh host squeue -j ID` per job.

Ours is workers_app.jobs.poll_cluster over the kept SSH connection, counting the commands it
sends. The usual portal way is one new OpenSSH process per job and poll. Jobs are held
(`sbatch --hold`), so a thousand of them wait without running; all are cancelled at the end.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from dataclasses import dataclass

from bench.report import Goal, Outcome, Table, seconds, times
from harness.cluster import SshTarget, sshd_connections
from harness.objects import forget_workers, run_id, run_user, start_afresh

NAME = "polling"


@dataclass
class OursCycle:
    jobs: int
    commands: int
    first_cycle: float  # includes opening the SSH connection
    cycle: float  # median of the kept-connection cycles
    connects: float  # new SSH connections per kept-connection cycle


@dataclass
class PerJobCycle:
    jobs: int
    measured: int
    per_job: float
    connections: int  # accepted by sshd while the measured ones ran

    @property
    def connections_per_cycle(self) -> float:
        return self.connections * self.jobs / self.measured

    @property
    def cycle(self) -> float:
        return self.per_job * self.jobs


def _poll_cycles(cluster_id: int, jobs: int, cycles: int) -> OursCycle:
    from workers_app.connections import close_all_connections
    from workers_app.jobs import poll_cluster
    from workers_app.models import Worker
    from workers_app.schedulers.ssh import commands_run_total
    from workers_app.statuses import WorkerStatus

    close_all_connections()
    started = time.perf_counter()
    checked = poll_cluster(cluster_id)
    first = time.perf_counter() - started
    if checked != jobs:
        raise RuntimeError(f"poll checked {checked} workers, expected {jobs}")
    connects_before = sshd_connections()
    durations, commands = [], set()
    for _ in range(cycles):
        before = commands_run_total()
        started = time.perf_counter()
        poll_cluster(cluster_id)
        durations.append(time.perf_counter() - started)
        commands.add(commands_run_total() - before)
    if len(commands) != 1:
        raise RuntimeError(f"commands per cycle varied between cycles: {sorted(commands)}")
    queued = Worker.objects.filter(cluster_id=cluster_id, status=WorkerStatus.QUEUED).count()
    if queued != jobs:
        raise RuntimeError(f"held jobs changed status: {queued} of {jobs} still queued")
    connects = (sshd_connections() - connects_before) / cycles
    return OursCycle(jobs, commands.pop(), first, statistics.median(durations), connects)


def _per_job_cycle(target: SshTarget, job_ids: list[str], jobs: int, sample: int) -> PerJobCycle:
    """One new `ssh ... squeue -j ID` per job, one after the other, as portals poll."""
    if len(job_ids) > sample:
        step = len(job_ids) / sample
        job_ids = [job_ids[int(i * step)] for i in range(sample)]
    connections = sshd_connections()
    started = time.perf_counter()
    for job_id in job_ids:
        result = subprocess.run(
            target.ssh_argv("squeue", "-j", job_id),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0 or job_id not in result.stdout:
            raise RuntimeError(f"ssh squeue -j {job_id} failed: {result.stderr.strip()[:300]}")
    elapsed = time.perf_counter() - started
    return PerJobCycle(
        jobs=jobs,
        measured=len(job_ids),
        per_job=elapsed / len(job_ids),
        connections=sshd_connections() - connections,
    )


def run(
    target: SshTarget,
    *,
    sizes: tuple[int, ...] = (1, 100, 1000),
    sample: int = 50,
    full_up_to: int = 100,
    cycles: int = 5,
) -> Outcome:
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    cluster = start_afresh(target)
    owner = run_user()
    tag = f"bench-poll-{run_id()}"
    job_ids: list[str] = []
    ours: list[OursCycle] = []
    theirs: list[PerJobCycle] = []
    try:
        for size in sorted(sizes):
            names = [f"{tag}-{i}" for i in range(len(job_ids), size)]
            new_ids = target.sbatch_held(names)
            job_ids += new_ids
            Worker.objects.bulk_create(
                Worker(
                    name=name,
                    owner=owner,
                    cluster=cluster,
                    status=WorkerStatus.QUEUED,
                    scheduler_job_id=job_id,
                )
                for name, job_id in zip(names, new_ids, strict=True)
            )
            ours.append(_poll_cycles(cluster.pk, size, cycles))
            theirs.append(
                _per_job_cycle(target, job_ids, size, size if size <= full_up_to else sample)
            )
            print(
                f"  polling {size} jobs: ours {ours[-1].cycle:.3f} s, "
                f"per-job {theirs[-1].cycle:.1f} s",
                flush=True,
            )
    finally:
        target.cancel_ids(job_ids)
        forget_workers()
    return _outcome(ours, theirs, cycles)


def _outcome(ours: list[OursCycle], theirs: list[PerJobCycle], cycles: int) -> Outcome:
    table = Table(
        "Status polling: one poll cycle over all live jobs (held jobs on the real Slurm)",
        [
            "jobs",
            "ours: commands",
            "ours: new connections",
            "ours: cycle",
            "ours: 1st cycle (+connect)",
            "per-job ssh: commands",
            "per-job ssh: new connections",
            "per-job ssh: cycle",
            "measured",
            "ours faster by",
        ],
    )
    for mine, other in zip(ours, theirs, strict=True):
        how = (
            "all"
            if other.measured == other.jobs
            else f"{other.measured} of {other.jobs}, extrapolated"
        )
        table.add(
            mine.jobs,
            mine.commands,
            f"{mine.connects:g}",
            seconds(mine.cycle),
            seconds(mine.first_cycle),
            other.jobs,
            f"{other.connections_per_cycle:g}",
            seconds(other.cycle),
            how,
            times(other.cycle / mine.cycle),
        )
    table.notes += [
        f"ours: workers_app.jobs.poll_cluster in-process over the kept paramiko connection; "
        f"median of {cycles} cycles after a first one that opens the connection; commands "
        "counted by workers_app.schedulers.ssh.commands_run_total().",
        "per-job ssh: `ssh -i KEY -p PORT ... pwtest@127.0.0.1 squeue -j ID` (OpenSSH client, "
        "no multiplexing), one after the other; where a sample was timed, the cycle is the "
        "mean time per job times the number of jobs (linear extrapolation).",
        "new connections: counted in the test sshd's log while a cycle ran (per-job: scaled "
        "like the time where a sample was timed).",
    ]
    largest, smallest = ours[-1], ours[0]
    goals = [
        Goal(
            NAME,
            "commands per cycle independent of the number of jobs",
            ", ".join(f"{c.jobs} jobs: {c.commands}" for c in ours),
            largest.commands == smallest.commands,
        ),
        Goal(
            NAME,
            f"at {largest.jobs} jobs, >= 100x less time per cycle than per-job polling",
            times(theirs[-1].cycle / largest.cycle),
            theirs[-1].cycle / largest.cycle >= 100,
        ),
    ]
    return Outcome([table], goals)

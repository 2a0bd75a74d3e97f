"""Status polling: our poll cycle against one `ssh host squeue -j ID` per job, with the jobs
spread over 1, 10 and 50 users' own cluster accounts; then the same on Grid Engine against one
`ssh host qstat -j ID` per job.

Ours is workers_app.actions.jobs.poll_cluster, one status command per account with live jobs
over that account's kept SSH connection, counting the commands it sends. The usual portal way is
one new OpenSSH process per job and poll. Jobs are held (`sbatch --hold`), so a thousand of them
wait without running; all are cancelled at the end.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench.report import Goal, Outcome, Table, seconds, times
from harness import HarnessError, cells
from harness.cluster import SshTarget, sshd_connections
from harness.objects import forget_workers, register_cluster, run_id, run_user, start_afresh

if TYPE_CHECKING:
    from workers_app.models import Cluster, ClusterAccount

NAME = "polling"


@dataclass
class OursCycle:
    jobs: int
    accounts: int  # platform accounts the jobs are spread over
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
    # The same over one multiplexed connection (ControlMaster=auto): time per job.
    per_job_multiplexed: float = float("nan")

    @property
    def cycle_multiplexed(self) -> float:
        return self.per_job_multiplexed * self.jobs

    @property
    def connections_per_cycle(self) -> float:
        return self.connections * self.jobs / self.measured

    @property
    def cycle(self) -> float:
        return self.per_job * self.jobs


def _poll_cycles(cluster_id: int, jobs: int, cycles: int, *, accounts: int) -> OursCycle:
    from core.transport.connection import commands_run_total
    from workers_app.actions.jobs import poll_cluster
    from workers_app.cluster_access import close_all_connections
    from workers_app.models import Worker
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
    return OursCycle(jobs, accounts, commands.pop(), first, statistics.median(durations), connects)


def _per_job_cycle(
    target: SshTarget, job_ids: list[str], jobs: int, sample: int, status: str = "squeue"
) -> PerJobCycle:
    """`ssh ... squeue -j ID` (or `qstat -j ID`) per job, one after the other, as portals poll:
    a new connection each, and (timed again) over one multiplexed connection, as a careful user
    configures."""
    if len(job_ids) > sample:
        step = len(job_ids) / sample
        job_ids = [job_ids[int(i * step)] for i in range(sample)]

    def each(control: Path | None) -> float:
        started = time.perf_counter()
        for job_id in job_ids:
            result = subprocess.run(
                target.ssh_argv(status, "-j", job_id, control_dir=control),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if result.returncode != 0 or job_id not in result.stdout:
                raise RuntimeError(
                    f"ssh {status} -j {job_id} failed: {result.stderr.strip()[:300]}"
                )
        return (time.perf_counter() - started) / len(job_ids)

    connections = sshd_connections()
    per_job = each(None)
    opened = sshd_connections() - connections
    control = Path(tempfile.mkdtemp(prefix="bench-poll-ssh-"))
    try:
        multiplexed = each(control)
    finally:
        target.close_master(control)
    return PerJobCycle(
        jobs=jobs,
        measured=len(job_ids),
        per_job=per_job,
        connections=opened,
        per_job_multiplexed=multiplexed,
    )


@dataclass(frozen=True)
class Login:
    """One Unix user of the test cluster: its jobs are submitted as it, accounts map onto it."""

    target: SshTarget
    private_key: str


def _logins(target: SshTarget) -> list[Login]:
    logins = [Login(target, target.private_key)]
    for name, key_path in sorted(target.accounts.items()):
        logins.append(
            Login(replace(target, user=name, key_path=key_path), Path(key_path).read_text())
        )
    return logins


def _accounts(cluster: Cluster, logins: list[Login], count: int) -> list[ClusterAccount]:
    """``count`` platform users, each with a verified account on the cluster, mapped in turn
    onto the cluster's few Unix users."""
    from workers_app.actions.cluster_accounts import connect_account, verify_account

    accounts = []
    for i in range(count):
        login = logins[i % len(logins)]
        account = connect_account(
            run_user(f"bench-poll-{i}"),
            cluster,
            remote_username=login.target.user,
            private_key=login.private_key,
        )
        if not verify_account(account):
            raise RuntimeError(f"account {i} ({login.target.user}) did not verify")
        accounts.append(account)
    return accounts


def _add_jobs(
    cluster: Cluster,
    accounts: list[ClusterAccount],
    logins: list[Login],
    tag: str,
    first: int,
    last: int,
) -> list[str]:
    """Jobs first..last-1, job i belonging to account i mod len(accounts): each submitted held
    as its account's Unix user (one local shell per user), a queued worker row per job."""
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    by_user: dict[str, list[tuple[str, ClusterAccount]]] = {}
    for i in range(first, last):
        account = accounts[i % len(accounts)]
        by_user.setdefault(account.remote_username, []).append((f"{tag}-{i}", account))
    made: list[str] = []
    for login in logins:
        wanted = by_user.get(login.target.user, [])
        ids = login.target.sbatch_held([name for name, _ in wanted])
        made += ids
        Worker.objects.bulk_create(
            Worker(
                name=name,
                owner_id=account.user_id,
                cluster=cluster,
                account=account,
                status=WorkerStatus.QUEUED,
                scheduler_job_id=job_id,
            )
            for (name, account), job_id in zip(wanted, ids, strict=True)
        )
    return made


def _ended_jobs_listed() -> int:
    """Jobs slurmctld still lists after they ended (kept MinJobAge seconds): earlier runs' and
    earlier configurations' cancelled jobs, which slow every squeue and so every cycle."""
    listed = subprocess.run(
        ["squeue", "--noheader", "--states=all", "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    return sum(state not in LIVE_STATES for state in listed)


LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}


def run(
    target: SshTarget,
    *,
    sizes: tuple[int, ...] = (1, 100, 1000),
    account_counts: tuple[int, ...] = (1, 10, 50),
    sample: int = 50,
    full_up_to: int = 100,
    cycles: int = 5,
) -> Outcome:
    from workers_app.models import ClusterAccount, Worker

    cluster = start_afresh(target)
    # Every user acts as their own account: a poll is one command per account with live jobs.
    cluster.shared = False
    cluster.save(update_fields=["shared"])
    logins = _logins(target)
    accounts = _accounts(cluster, logins, max(account_counts))
    tag = f"bench-poll-{run_id()}"
    ours: list[OursCycle] = []
    theirs: dict[int, PerJobCycle] = {}
    try:
        for count in sorted(account_counts):
            job_ids: list[str] = []
            try:
                for size in sorted(sizes):
                    job_ids += _add_jobs(
                        cluster, accounts[:count], logins, f"{tag}-{count}", len(job_ids), size
                    )
                    dead = _ended_jobs_listed()
                    ours.append(_poll_cycles(cluster.pk, size, cycles, accounts=count))
                    if size not in theirs:
                        # As the cluster's account, which sees its own jobs: those of account 0.
                        own = list(
                            Worker.objects.filter(
                                cluster=cluster, account__remote_username=target.user
                            ).values_list("scheduler_job_id", flat=True)
                        )
                        measured = size if size <= full_up_to else sample
                        theirs[size] = _per_job_cycle(target, own, size, measured)
                    print(
                        f"  polling {size} jobs over {count} accounts: ours "
                        f"{ours[-1].commands} commands, {ours[-1].cycle:.3f} s; per-job "
                        f"{theirs[size].cycle:.1f} s ({dead} ended jobs still listed by "
                        "slurmctld: every squeue walks them)",
                        flush=True,
                    )
            finally:
                target.cancel_ids(job_ids)
                Worker.objects.filter(cluster=cluster).delete()
    finally:
        forget_workers()
        ClusterAccount.objects.filter(cluster=cluster).delete()
    outcome = _outcome(ours, [theirs[c.jobs] for c in ours], cycles, len(logins))
    gridengine = _gridengine(target, sizes, sample=sample, full_up_to=full_up_to, cycles=cycles)
    return Outcome(outcome.tables + gridengine.tables, outcome.goals + gridengine.goals)


def _gridengine(
    target: SshTarget, sizes: tuple[int, ...], *, sample: int, full_up_to: int, cycles: int
) -> Outcome:
    """The same cycle on the Grid Engine cell: the cluster account's held jobs, polled with one
    `qstat -xml` against `ssh ... qstat -j ID` per job."""
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    cell = cells.cell("gridengine", target)
    if not isinstance(cell, cells.GridEngineCell):
        raise HarnessError("the test cluster's gridengine cell is not a Grid Engine cell")
    cluster = register_cluster(target, name="bench-gridengine", scheduler="gridengine")
    tag = f"bench-poll-ge-{run_id()}"
    ours: list[OursCycle] = []
    theirs: list[PerJobCycle] = []
    job_ids: list[str] = []
    try:
        for size in sorted(sizes):
            names = [f"{tag}-{i}" for i in range(len(job_ids), size)]
            made = cell.hold_many(target.user, names)
            job_ids += made
            Worker.objects.bulk_create(
                Worker(
                    name=name,
                    owner=run_user(),
                    cluster=cluster,
                    status=WorkerStatus.QUEUED,
                    scheduler_job_id=job_id,
                )
                for name, job_id in zip(names, made, strict=True)
            )
            ours.append(_poll_cycles(cluster.pk, size, cycles, accounts=1))
            measured = size if size <= full_up_to else sample
            theirs.append(_per_job_cycle(target, job_ids, size, measured, status="qstat"))
            print(
                f"  polling {size} Grid Engine jobs: ours {ours[-1].commands} commands, "
                f"{ours[-1].cycle:.3f} s; per-job {theirs[-1].cycle:.1f} s",
                flush=True,
            )
    finally:
        cell.cancel_ids(job_ids)
        Worker.objects.filter(cluster=cluster).delete()
    table = Table(
        "Status polling on Grid Engine: one poll cycle over the cluster account's held jobs "
        "(the real one-node cell)",
        [
            "jobs",
            "ours: commands",
            "ours: cycle",
            "ours: 1st cycle (+connect)",
            "per-job ssh qstat -j: new connections",
            "per-job ssh qstat -j: cycle",
            "multiplexed: cycle",
            "measured",
            "ours faster by: warm / cold",
            "than multiplexed: warm / cold",
        ],
    )
    for mine, other in zip(ours, theirs, strict=True):
        table.add(
            mine.jobs,
            mine.commands,
            seconds(mine.cycle),
            seconds(mine.first_cycle),
            f"{other.connections_per_cycle:g}",
            seconds(other.cycle),
            seconds(other.cycle_multiplexed),
            "all" if other.measured == other.jobs else f"{other.measured} of {other.jobs}",
            f"{times(other.cycle / mine.cycle)} / {times(other.cycle / mine.first_cycle)}",
            f"{times(other.cycle_multiplexed / mine.cycle)} / "
            f"{times(other.cycle_multiplexed / mine.first_cycle)}",
        )
    table.notes += [
        "jobs: held (`qsub -h -b y sleep 600`, one local shell) as the cluster account pwtest, "
        "a queued worker row each on a shared cluster of scheduler gridengine.",
        f"ours: workers_app.actions.jobs.poll_cluster in-process; one `qstat -xml -u pwtest` lists "
        "the "
        f"account's jobs whatever their number; median of {cycles} cycles after a first one "
        "that opens the connection.",
        "per-job: `ssh ... pwtest@127.0.0.1 qstat -j ID` (OpenSSH client) one after the other, "
        "a new connection each, then over one multiplexed connection; where a sample was timed "
        "the cycle is extrapolated linearly.",
    ]
    goals = [
        Goal(
            NAME,
            "Grid Engine: one command per cycle, whatever the number of jobs",
            ", ".join(f"{c.jobs} jobs {c.commands}" for c in ours),
            all(c.commands == 1 for c in ours),
        )
    ]
    return Outcome([table], goals)


def _outcome(
    ours: list[OursCycle], theirs: list[PerJobCycle], cycles: int, unix_users: int
) -> Outcome:
    table = Table(
        "Status polling: one poll cycle over all live jobs, spread over users' own accounts "
        "(held jobs on the real Slurm)",
        [
            "jobs",
            "accounts",
            "accounts with jobs",
            "ours: commands",
            "ours: new connections",
            "ours: cycle",
            "ours: 1st cycle (+connect)",
            "per-job ssh: commands",
            "per-job ssh: new connections",
            "per-job ssh: cycle",
            "per-job ssh multiplexed: cycle",
            "measured",
            "ours faster by: warm / cold",
            "than multiplexed: warm / cold",
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
            mine.accounts,
            min(mine.jobs, mine.accounts),
            mine.commands,
            f"{mine.connects:g}",
            seconds(mine.cycle),
            seconds(mine.first_cycle),
            other.jobs,
            f"{other.connections_per_cycle:g}",
            seconds(other.cycle),
            seconds(other.cycle_multiplexed),
            how,
            f"{times(other.cycle / mine.cycle)} / {times(other.cycle / mine.first_cycle)}",
            f"{times(other.cycle_multiplexed / mine.cycle)} / "
            f"{times(other.cycle_multiplexed / mine.first_cycle)}",
        )
    table.notes += [
        f"accounts: platform users each with a verified ClusterAccount on a cluster that is not "
        f"shared; the test cluster has {unix_users} Unix users (pwtest, pwalice, pwbob), so the "
        f"accounts map onto them in turn (account i logs in as user i mod {unix_users}), each "
        "with its own SSH connection; job i belongs to account i mod accounts and is submitted "
        "held (`sbatch --hold`, one local shell per Unix user) as that account's Unix user.",
        f"ours: workers_app.actions.jobs.poll_cluster in-process, one status command per account "
        "with "
        f"live jobs over that account's kept paramiko connection; median of {cycles} cycles "
        "after a first one that opens the connections; commands counted by "
        "core.transport.connection.commands_run_total().",
        "per-job ssh: `ssh -i KEY -p PORT ... pwtest@127.0.0.1 squeue -j ID` (OpenSSH client), "
        "one after the other, timed once per number of jobs (its cost does not depend on whose "
        "job it is): a new connection each, then again over one multiplexed connection "
        "(ControlMaster=auto, ControlPersist: the master is opened by the first); where a "
        "sample was timed, the cycle is the mean time per job times the number of jobs "
        "(linear extrapolation).",
        "ours faster by: warm = against our median cycle over kept connections; cold = "
        "against our first cycle, which opens every account's connection.",
        "new connections: counted in the test sshd's log while a cycle ran (per-job: scaled "
        "like the time where a sample was timed).",
    ]
    wrong = [c for c in ours if c.commands != min(c.jobs, c.accounts)]
    goals = [
        Goal(
            NAME,
            "commands per cycle = accounts with live jobs, whatever the number of jobs",
            "; ".join(
                f"{c.accounts} acct: "
                + ", ".join(f"{o.jobs} jobs {o.commands}" for o in ours if o.accounts == c.accounts)
                for c in ours
                if c.jobs == ours[0].jobs
            ),
            not wrong,
        ),
    ]
    largest = max(c.jobs for c in ours)
    for mine, other in zip(ours, theirs, strict=True):
        if mine.jobs == largest:
            goals.append(
                Goal(
                    NAME,
                    f"at {largest} jobs over {mine.accounts} accounts, >= 100x less time per "
                    "cycle than per-job polling multiplexed, warm and cold",
                    f"{times(other.cycle_multiplexed / mine.cycle)} warm, "
                    f"{times(other.cycle_multiplexed / mine.first_cycle)} cold (new connection "
                    f"each: {times(other.cycle / mine.cycle)}, "
                    f"{times(other.cycle / mine.first_cycle)})",
                    other.cycle_multiplexed / mine.first_cycle >= 100,
                )
            )
    return Outcome([table], goals)

"""GridEngineAdapter against the real one-node Grid Engine cell over real SSH."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from core.transport.connection import SSHConnection
from harness.cells import GRIDENGINE_SPOOL, cell
from harness.waiting import wait_for as poll_until
from schedulers.base import (
    JobInfo,
    JobSpec,
    Phase,
    QueryFailed,
    SchedulerError,
    SchedulerUnavailable,
)
from schedulers.gridengine import SUBMIT_PARALLEL, GridEngineAdapter
from tests.conftest import SshTarget
from tests.schedulers.conftest import has_ended, is_running, wait_for

pytestmark = pytest.mark.slurm

HOSTILE = 'it\'s "quoted" $(touch ~/pwned) `id` ; rm -rf ~ \n second line \\ end'
NOT_BEFORE_2099 = "-a 209901010000"


@pytest.fixture(scope="module")
def gridengine(ssh: SSHConnection) -> GridEngineAdapter:
    return GridEngineAdapter(ssh)


@pytest.fixture(scope="module")
def queue(ssh_target: SshTarget) -> str:
    return cell("gridengine", ssh_target).queue


@pytest.fixture
def submitted(gridengine: GridEngineAdapter) -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for job_id in ids:
        gridengine.cancel(job_id)


def submit(
    adapter: GridEngineAdapter,
    submitted: list[str],
    name: str,
    command: str,
    *,
    directives: tuple[str, ...] = (),
    environment: dict[str, str] | None = None,
) -> str:
    job_id = adapter.submit(
        JobSpec(
            name=name,
            partition="",
            directives=list(directives),
            environment=environment or {},
            command=command,
        )
    )
    submitted.append(job_id)
    return job_id


@pytest.fixture(scope="module")
def timeout_job(gridengine: GridEngineAdapter) -> Iterator[str]:
    """A job with a 5 s h_rt submitted when the module starts, so its end overlaps other tests."""
    job_id = gridengine.submit(
        JobSpec(
            name=f"pwtest-{uuid.uuid4().hex[:8]}-timeout",
            partition="",
            directives=["-l h_rt=5"],
            command="sleep 600",
        )
    )
    yield job_id
    gridengine.cancel(job_id)


@pytest.fixture(autouse=True)
def _start_the_slow_job_first(timeout_job: str) -> None:
    """Every test here pulls in timeout_job, so the clock starts with the first one."""


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60, cwd="/"
    )


def test_job_is_queued_then_running_on_a_node_then_deleted(
    gridengine: GridEngineAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    queue: str,
) -> None:
    job_id = submit(gridengine, submitted, unique + "sleep", "sleep 300")
    first = gridengine.query([job_id]).get(job_id)
    assert first is not None and first.phase in {Phase.QUEUED, Phase.RUNNING}
    assert first.name == unique + "sleep"

    # (Its first state on the node is TRANSFERRING: running, the script not started yet.)
    running = wait_for(
        gridengine, job_id, lambda info: is_running(info) and info.state == "RUNNING"
    )
    assert running is not None
    hostname = ssh.run(["hostname", "-s"]).stdout.strip()
    assert (running.state, running.node) == ("RUNNING", hostname)

    gridengine.cancel(job_id)
    wait_for(gridengine, job_id, has_ended, timeout=60)
    final = wait_for_final(gridengine, job_id)
    assert (final.phase, final.state, final.failed) == (Phase.ENDED, "KILLED", False)
    gridengine.cancel(job_id)  # deleting an ended job is not an error


def wait_for_final(adapter: GridEngineAdapter, job_id: str) -> JobInfo:
    """The final state, once accounting has written it (it may lag the job's end)."""

    def final() -> JobInfo | None:
        try:
            return adapter.final_state(job_id)
        except QueryFailed:
            return None

    return poll_until(final, timeout=30)


def test_job_exiting_3_is_failed_with_exit_code_3(
    gridengine: GridEngineAdapter, submitted: list[str], unique: str
) -> None:
    job_id = submit(gridengine, submitted, unique + "exit3", "exit 3")
    wait_for(gridengine, job_id, has_ended)
    final = wait_for_final(gridengine, job_id)
    assert (final.state, final.exit_code, final.failed) == ("FAILED", "3", True)
    done = submit(gridengine, submitted, unique + "done", "true")
    wait_for(gridengine, done, has_ended)
    final = wait_for_final(gridengine, done)
    assert (final.state, final.exit_code, final.failed) == ("COMPLETED", "0", False)


def test_time_limit_ends_as_timeout(gridengine: GridEngineAdapter, timeout_job: str) -> None:
    # Submitted with h_rt=5 when this module started: the execution daemon kills it then.
    wait_for(gridengine, timeout_job, has_ended, timeout=90, interval=1)
    final = wait_for_final(gridengine, timeout_job)
    assert (final.phase, final.state, final.exit_code, final.failed) == (
        Phase.ENDED,
        "TIMEOUT",
        "137",
        False,
    )


def test_find_job_and_platform_jobs_by_name(
    gridengine: GridEngineAdapter, submitted: list[str], unique: str
) -> None:
    live = submit(
        gridengine, submitted, unique + "live", "sleep 300", directives=(NOT_BEFORE_2099,)
    )
    done = submit(gridengine, submitted, unique + "done", "true")
    wait_for(gridengine, done, has_ended)

    assert gridengine.find_job(unique + "live") == live
    assert gridengine.find_job(unique + "done") is None
    assert gridengine.find_job(unique + "nothing") is None
    assert gridengine.list_platform_jobs(unique) == {live: unique + "live"}


def test_a_neighbours_job_of_the_same_name_is_neither_found_nor_listed(
    gridengine: GridEngineAdapter, submitted: list[str], unique: str, ssh_target: SshTarget
) -> None:
    neighbour = sorted(ssh_target.accounts)[-1]
    ours = submit(
        gridengine, submitted, unique + "twin", "sleep 300", directives=(NOT_BEFORE_2099,)
    )
    made = as_user(
        neighbour, "qsub", "-terse", "-h", "-N", unique + "twin", "-b", "y", "sleep", "600"
    )
    theirs = made.stdout.strip()
    assert made.returncode == 0, made.stderr
    try:
        assert int(theirs) > int(ours)
        assert gridengine.find_job(unique + "twin") == ours
        assert gridengine.find_jobs([unique + "twin", unique + "none"]) == {unique + "twin": ours}
        assert gridengine.list_platform_jobs(unique) == {ours: unique + "twin"}
    finally:
        as_user(neighbour, "qdel", theirs)


def test_a_poll_of_200_ids_is_one_command(
    gridengine: GridEngineAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    job_id = submit(
        gridengine, submitted, unique + "many", "sleep 300", directives=(NOT_BEFORE_2099,)
    )
    ids = [job_id] + [str(90_000_000 + n) for n in range(199)]
    before = ssh.commands_run
    result = gridengine.query(ids)
    assert ssh.commands_run - before == 1
    assert set(result.jobs) == {job_id}
    info = result.get(job_id)
    assert info is not None and (info.phase, info.state) == (Phase.QUEUED, "PENDING")


def test_an_id_nobody_knows_has_no_final_state(gridengine: GridEngineAdapter) -> None:
    assert gridengine.query(["90000000"]).jobs == {}
    assert gridengine.final_state("90000000") is None


def test_queues_are_environments_with_their_slots(
    gridengine: GridEngineAdapter, queue: str
) -> None:
    partitions = {p.name: p for p in gridengine.partitions()}
    assert partitions[queue].nodes_total == 64
    assert partitions[queue].is_default


def test_refused_submit_raises_with_the_schedulers_reason(
    gridengine: GridEngineAdapter, unique: str
) -> None:
    job = JobSpec(name=unique + "bad", partition="no-such-queue", directives=[], command="true")
    with pytest.raises(SchedulerError, match=r"no-such-queue"):
        gridengine.submit(job)


def test_twenty_jobs_go_in_one_submit_many_and_one_qsub_refuses_is_its_own_outcome(
    gridengine: GridEngineAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    # Given 20 waiting jobs, each with a secret of its own, the eighth in a parallel environment
    # the cell does not have (a directive users may set, that qsub refuses)
    names = [f"{unique}batch{n}" for n in range(20)]
    secrets = {name: uuid.uuid4().hex for name in names}
    specs = [
        JobSpec(
            name=name,
            partition="",
            directives=[NOT_BEFORE_2099],
            environment={"SECRET": secrets[name]},
            command="sleep 300",
        )
        for name in names
    ]
    specs[7] = replace(specs[7], directives=["-pe nosuchpe 1"])
    before = ssh.commands_run
    try:
        # When they are submitted in one call
        outcomes = gridengine.submit_many(specs)
        made = {name: o for name, o in zip(names, outcomes, strict=True) if isinstance(o, str)}
        submitted.extend(made.values())

        # Then in as many commands as run at once; the eighth refused in qsub's words, the 19
        # others made and found by name with their ids, each with its own environment
        assert ssh.commands_run - before == SUBMIT_PARALLEL
        refusal = outcomes[7]
        assert isinstance(refusal, SchedulerError), refusal
        assert not isinstance(refusal, SchedulerUnavailable)
        assert 'parallel environment "nosuchpe" does not exist' in str(refusal)
        assert sorted(made) == sorted(names[:7] + names[8:])
        assert len(set(made.values())) == 19
        assert gridengine.find_jobs(names) == made
        environments = ssh.run(["cat", *(f".activate/jobs/{name}.env" for name in made)])
        assert environments.stdout == "".join(f"SECRET={secrets[name]}\n" for name in made)
    finally:
        ssh.run(["sh", "-c", f'rm -f "$HOME"/.activate/jobs/{unique}batch*.env'])


def test_the_environment_reaches_the_job_verbatim_and_never_the_world_readable_spool(
    gridengine: GridEngineAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    ssh_target: SshTarget,
) -> None:
    out = f"{unique}env.txt"
    secret = uuid.uuid4().hex
    job_id = submit(
        gridengine,
        submitted,
        unique + "env",
        f'printf "%s|%s" "$HOSTILE" "$SECRET" > ~/{out}; sleep 300',
        environment={"HOSTILE": HOSTILE, "SECRET": secret},
    )
    wait_for(gridengine, job_id, is_running)
    home = Path(f"~{ssh_target.user}").expanduser()
    try:
        assert poll_until(lambda: ssh.run(["cat", out]).stdout, timeout=30) == f"{HOSTILE}|{secret}"
        assert ssh.run(["test", "-e", "pwned"]).exit_status == 1
        # The job read its environment file and removed it; the directory is the account's own.
        assert not (home / ".activate" / "jobs" / f"{unique}env.env").exists()
        assert (home / ".activate" / "jobs").stat().st_mode & 0o077 == 0
        # A neighbour reads the job's script in the execution host's spool (the OS lets him),
        # and finds no value of its environment there.
        neighbour = sorted(ssh_target.accounts)[-1]
        script = as_user(neighbour, "sh", "-c", f"cat {GRIDENGINE_SPOOL}/*/job_scripts/{job_id}")
        assert script.returncode == 0 and unique + "env" in script.stdout, script.stderr
        assert secret not in script.stdout
    finally:
        ssh.run(["rm", "-f", out])


def test_a_command_runs_inside_the_job_as_a_task_and_a_neighbour_is_refused(
    gridengine: GridEngineAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    ssh_target: SshTarget,
) -> None:
    job_id = submit(gridengine, submitted, unique + "task", "sleep 300")
    running = wait_for(gridengine, job_id, is_running)
    assert running is not None
    # The task carries the job's id, and Grid Engine accounts it to the job (a record of its
    # own under the job's number, with the task's exit status) while the job still runs.
    result = gridengine.run_in_job(job_id, ["sh", "-c", 'echo "$JOB_ID"; exit 4'])
    assert (result.exit_status, result.stdout) == (4, f"{job_id}\n"), result.stderr

    def task_accounted() -> bool:
        record = ssh.run(["qacct", "-j", job_id]).stdout
        return bool(re.search(r"^exit_status\s+4\s*$", record, flags=re.MULTILINE))

    assert poll_until(task_accounted, timeout=30)
    assert gridengine.query([job_id]).get(job_id) is not None
    # The same task asked for by another Unix user: the execution daemon refuses it.
    neighbour = sorted(ssh_target.accounts)[-1]
    entered = as_user(
        neighbour,
        *["env", f"JOB_ID={job_id}", "SGE_TASK_ID=undefined", "qrsh", "-inherit"],
        *[running.node, "id", "-un"],
    )
    assert entered.returncode != 0 and ssh_target.user not in entered.stdout
    assert "didn't accept task" in entered.stderr
    deleted = as_user(neighbour, "qdel", job_id)
    assert deleted.returncode != 0 and "privileges" in deleted.stdout + deleted.stderr
    assert gridengine.query([job_id]).get(job_id) is not None


def test_a_waiting_jobs_environment_file_is_refused_to_a_neighbour_by_the_os(
    gridengine: GridEngineAdapter, submitted: list[str], unique: str, ssh_target: SshTarget
) -> None:
    secret = uuid.uuid4().hex
    job_id = submit(
        gridengine,
        submitted,
        unique + "wait",
        "sleep 300",
        directives=(NOT_BEFORE_2099,),
        environment={"SECRET": secret},
    )
    waiting = gridengine.query([job_id]).get(job_id)
    assert waiting is not None and waiting.phase is Phase.QUEUED
    path = Path(f"~{ssh_target.user}").expanduser() / ".activate" / "jobs" / f"{unique}wait.env"
    assert secret in path.read_text()  # (read as root: the file is there while the job waits)
    assert path.stat().st_mode & 0o777 == 0o600
    neighbour = sorted(ssh_target.accounts)[-1]
    refused = as_user(neighbour, "cat", str(path))
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert secret not in refused.stdout
    # Nor can he put an environment of his own (another platform URL) where the job reads one.
    planted = as_user(neighbour, "sh", "-c", f"echo ACTIVATE_URL=http://evil > {path.parent}/x.env")
    assert planted.returncode != 0 and "Permission denied" in planted.stderr
    assert not (path.parent / "x.env").exists()
    assert path.parent.stat().st_mode & 0o777 == 0o700

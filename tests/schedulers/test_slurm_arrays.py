"""SlurmAdapter's job arrays (a bulk of jobs in one sbatch a share) against the real single-node
Slurm cluster over real SSH."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from core.transport.connection import SSHConnection
from schedulers import slurm as slurm_module
from schedulers.base import (
    JobSpec,
    Phase,
    QueryFailed,
    SchedulerError,
    environment_file,
    task_key,
)
from schedulers.slurm import SlurmAdapter
from tests.conftest import SshTarget
from tests.schedulers.conftest import HOSTILE, NOT_BEFORE_AN_HOUR, has_ended, is_running, wait_for

pytestmark = pytest.mark.slurm

JOBS = ".activate/jobs"


@pytest.fixture(autouse=True)
def _remove_files(ssh: SSHConnection, unique: str) -> Iterator[None]:
    """The files a test's jobs leave in the account's home: environments of tasks that never
    started, what the tasks wrote."""
    yield
    ssh.run(["sh", "-c", f'rm -f "$HOME/{JOBS}/{unique}"* "$HOME/{unique}"*'])


def arrays_of(outcomes: Sequence[str | SchedulerError]) -> list[str]:
    """The array numbers of "N_M" outcomes, in order of first appearance."""
    numbers: list[str] = []
    for outcome in outcomes:
        assert isinstance(outcome, str) and re.fullmatch(r"[0-9]+_[0-9]+", outcome), outcome
        number = outcome.split("_")[0]
        if number not in numbers:
            numbers.append(number)
    return numbers


def listed(ssh: SSHConnection, unique: str) -> dict[str, tuple[str, str]]:
    """The account's live jobs named with ``unique``, one line per task, as squeue itself prints
    them: "N_M" -> (name, own job number)."""
    result = ssh.run(["squeue", "--noheader", "--me", "--array", "--format=%i|%j|%A|%T"])
    assert result.exit_status == 0, result.stderr
    jobs = {}
    for line in result.stdout.splitlines():
        job_id, name, own, state = line.strip().split("|")
        if name.startswith(unique) and state not in {"CANCELLED", "COMPLETED"}:
            jobs[job_id] = (name, own)
    return jobs


def keyed(
    specs: list[JobSpec], outcomes: list[str | SchedulerError], ssh: SSHConnection, unique: str
) -> list[JobSpec]:
    """``specs`` as their tasks were sent: each with its array's name (as squeue names the task
    its outcome is) and its index (the outcome's)."""
    names = listed(ssh, unique)
    return [
        replace(spec, array=names[str(outcome)][0], index=int(str(outcome).split("_")[1]))
        for spec, outcome in zip(specs, outcomes, strict=True)
    ]


def wait_until(check: Callable[[], bool], what: str, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout}s")
        time.sleep(0.3)


def ssh_user(ssh: SSHConnection) -> str:
    return ssh.run(["id", "-un"]).stdout.strip()


def held(unique: str, count: int, **environment: str) -> list[JobSpec]:
    return [
        JobSpec(
            name=f"{unique}held{n}",
            partition="",
            directives=[NOT_BEFORE_AN_HOUR],
            environment={**environment, "KEY": uuid.uuid4().hex},
            command="sleep 300",
        )
        for n in range(count)
    ]


def test_a_bulk_goes_as_one_array_in_one_command_and_every_task_is_found_by_its_key(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    # Given 7 held jobs alike, each with a secret of its own and a hostile environment value
    specs = held(unique, 7, HOSTILE=HOSTILE)
    # When they are submitted together
    before = ssh.commands_run
    outcomes = slurm.submit_many(specs)
    numbers = arrays_of(outcomes)
    submitted += numbers
    # Then one command made one array, in order: the jobs its tasks 0-6
    assert ssh.commands_run - before == 1
    [number] = numbers
    assert outcomes == [f"{number}_{i}" for i in range(7)]
    # And squeue lists the seven tasks, under the first job's name and a tag
    tasks = listed(ssh, unique)
    assert sorted(tasks) == sorted(str(o) for o in outcomes)
    assert re.fullmatch(re.escape(specs[0].name) + "-[0-9a-f]{6}", tasks[f"{number}_0"][0])
    assert {name for name, _ in tasks.values()} == {tasks[f"{number}_0"][0]}
    # And every task is found by its key, in one command, and listed as the platform's
    sent = keyed(specs, outcomes, ssh, unique)
    keys = [spec.key for spec in sent]
    assert keys[0] == task_key(tasks[f"{number}_0"][0], 0)
    before = ssh.commands_run
    assert slurm.find_jobs([*keys, task_key(sent[0].array, 7)]) == dict(
        zip(keys, outcomes, strict=True)
    )
    assert ssh.commands_run - before == 1
    assert slurm.find_job(keys[4]) == outcomes[4]
    assert slurm.list_platform_jobs(unique) == dict(zip(outcomes, keys, strict=True))
    # And each task's environment waits for it in a file of the account's alone, verbatim
    files = [f"{JOBS}/{spec.array}.{spec.index}.env" for spec in sent]
    modes = ssh.run(["stat", "--format=%a %U", *files])
    assert modes.exit_status == 0, modes.stderr
    assert set(modes.stdout.splitlines()) == {f"600 {ssh_user(ssh)}"}
    for spec, file in zip(sent, files, strict=True):
        assert ssh.run(["cat", file]).stdout == environment_file(spec)
    assert ssh.run(["test", "-e", "pwned"]).exit_status == 1
    # And a waiting task is no place to run a command
    with pytest.raises(SchedulerError, match="not running"):
        slurm.run_in_job(str(outcomes[1]), ["true"])


def test_each_running_task_gets_its_own_environment_and_runs_commands_under_its_own_number(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    # Given 4 jobs alike that start at once, each with a value of its own, which each writes
    # where its task id names it
    marks = [f"{HOSTILE}{uuid.uuid4().hex}" for _ in range(4)]
    command = (
        f'f="$HOME/{unique}seen.${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"; '
        'printf "%s" "$MARK" > "$f.tmp" && mv "$f.tmp" "$f"; exec sleep 300'
    )
    specs = [
        JobSpec(
            name=f"{unique}run{n}",
            partition="",
            directives=[],
            environment={"MARK": mark},
            command=command,
        )
        for n, mark in enumerate(marks)
    ]
    # When they are submitted together and run
    outcomes = slurm.submit_many(specs)
    numbers = arrays_of(outcomes)
    submitted += numbers
    for outcome in outcomes:
        wait_for(slurm, str(outcome), is_running)
    seen = [f"{unique}seen.{outcome}" for outcome in outcomes]
    wait_until(lambda: ssh.run(["ls", *seen]).exit_status == 0, "all written")
    # Then each task saw its own job's value, and its environment file is gone
    assert [ssh.run(["cat", path]).stdout for path in seen] == marks
    left = ssh.run(["sh", "-c", f'ls -A "$HOME/{JOBS}" | grep -F "{unique}" || true'])
    assert left.stdout == ""
    assert ssh.run(["test", "-e", "pwned"]).exit_status == 1
    # And a command run in a task runs in that task's own allocation: its own job number,
    # squeue's, never the array's "N_M"
    own = {job_id: number for job_id, (_, number) in listed(ssh, unique).items()}
    answers = {}
    for outcome in outcomes:
        result = slurm.run_in_job(str(outcome), ["sh", "-c", "echo $SLURM_JOB_ID"], timeout=30)
        assert result.exit_status == 0, result.stderr
        answers[str(outcome)] = result.stdout.strip()
    assert answers == {str(o): own[str(o)] for o in outcomes}
    assert len(set(answers.values())) == 4 and all(a.isdigit() for a in answers.values())


def running(unique: str, count: int) -> list[JobSpec]:
    return [
        JobSpec(name=f"{unique}run{n}", partition="", directives=[], command="exec sleep 300")
        for n in range(count)
    ]


def test_cancelling_a_running_task_ends_that_task_alone_and_its_end_is_remembered(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    # Given two arrays (two kinds of job) of two running tasks each
    specs = running(unique, 4)
    specs[2:] = [replace(spec, directives=["--time=10"]) for spec in specs[2:]]
    outcomes = [str(o) for o in slurm.submit_many(specs)]
    numbers = arrays_of(outcomes)
    submitted += numbers
    first, second = numbers
    assert outcomes == [f"{first}_0", f"{first}_1", f"{second}_0", f"{second}_1"]
    for outcome in outcomes:
        wait_for(slurm, outcome, is_running)
    # When the second task of the first array is cancelled
    slurm.cancel(f"{first}_1")
    # Then it ends, cancelled, while its sibling and the other array run on
    ended = wait_for(slurm, f"{first}_1", has_ended)
    assert ended is None or (ended.state, ended.failed) == ("CANCELLED", False)
    live = slurm.query(outcomes)
    for job_id in (f"{first}_0", f"{second}_0", f"{second}_1"):
        info = live.get(job_id)
        assert info is not None and (info.phase, info.state) == (Phase.RUNNING, "RUNNING"), info
    assert set(listed(ssh, unique)) == {f"{first}_0", f"{second}_0", f"{second}_1"}
    # And its end is remembered as a cancellation (by scontrol: no accounting here)
    before = ssh.commands_run
    final = slurm.final_state(f"{first}_1")
    assert final is not None
    assert (final.job_id, final.phase, final.state) == (f"{first}_1", Phase.ENDED, "CANCELLED")
    assert ssh.commands_run - before == 2
    # And the sibling has no final state yet: asking is a doubt, never an end
    with pytest.raises(QueryFailed, match="still RUNNING"):
        slurm.final_state(f"{first}_0")
    slurm.cancel(f"{first}_1")  # cancelling an ended task is not an error


def test_a_task_cancelled_while_pending_is_not_a_query_failure_forever(
    slurm: SlurmAdapter, submitted: list[str], unique: str
) -> None:
    # Given two arrays of two held tasks each, the first array's second task cancelled while
    # pending (Slurm keeps no record of it: the array's own record just drops its index)
    outcomes = [str(o) for o in slurm.submit_many(held(unique, 4))]
    submitted += arrays_of(outcomes)
    first = submitted[0]
    assert outcomes[1] == f"{first}_1"
    slurm.cancel(outcomes[1])
    wait_for(slurm, outcomes[1], has_ended)
    # When its final state is asked for while its sibling still waits
    final = slurm.final_state(outcomes[1])
    # Then nobody remembers it, or it was cancelled: never a doubt that lasts as long as the
    # array does
    assert final is None or final.state == "CANCELLED"


def test_jobs_with_different_directives_go_in_arrays_of_their_own_each_in_order(
    slurm: SlurmAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given arrays sent one at a time (a group of alike jobs is then one array), and held jobs
    # of two kinds, interleaved: two with a ten-minute limit, three without
    monkeypatch.setattr(slurm_module, "ARRAY_PARALLEL", 1)
    specs = held(unique, 5)
    limited = [0, 2]
    for n in limited:
        specs[n] = replace(specs[n], directives=[NOT_BEFORE_AN_HOUR, "--time=10"])
    # When they are submitted together
    before = ssh.commands_run
    outcomes = slurm.submit_many(specs)
    numbers = arrays_of(outcomes)
    submitted += numbers
    # Then two commands made two arrays, each job a task of its kind's, in order
    assert ssh.commands_run - before == 2
    assert len(numbers) == 2
    first, second = numbers
    assert outcomes == [f"{first}_0", f"{second}_0", f"{first}_1", f"{second}_1", f"{second}_2"]
    # And each array has its kind's directives
    limits = ssh.run(["squeue", "--noheader", "--array", f"--jobs={first},{second}", "-o", "%i %l"])
    assert sorted(limits.stdout.split("\n")[:-1]) == sorted(
        [f"{first}_{i} 10:00" for i in range(2)] + [f"{second}_{i} UNLIMITED" for i in range(3)]
    )
    sent = keyed(specs, outcomes, ssh, unique)
    assert slurm.find_jobs([spec.key for spec in sent]) == {
        spec.key: outcome for spec, outcome in zip(sent, outcomes, strict=True)
    }


def test_an_array_sbatch_refuses_goes_one_sbatch_a_job(
    slurm: SlurmAdapter,
    ssh: SSHConnection,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a cluster whose MaxArraySize (1001, Slurm's default) is below our array size: one
    # array of up to 1002 tasks at a time, and 1002 held jobs alike
    limit = ssh.run(["sh", "-c", "scontrol show config | grep MaxArraySize"]).stdout.split()
    assert limit[-1] == "1001"
    monkeypatch.setattr(slurm_module, "ARRAY_TASKS", 1002)
    monkeypatch.setattr(slurm_module, "ARRAY_PARALLEL", 1)
    specs = held(unique, 1002)
    made: list[str] = []
    try:
        # When they are submitted together
        before = ssh.commands_run
        outcomes = slurm.submit_many(specs)
        made = [o for o in outcomes if isinstance(o, str)]
        # Then sbatch refused the array (one command), its tasks' environment files (each an
        # agent's key) were removed (one), and each job went on its own: one sbatch each, in
        # the login-host loop's commands; each outcome the job of that name
        assert all(isinstance(o, str) and o.isdigit() for o in outcomes), {
            str(o) for o in outcomes if not isinstance(o, str)
        }
        assert len(set(made)) == 1002
        chunk, parallel = slurm_module.SUBMIT_CHUNK, slurm_module.SUBMIT_PARALLEL
        loops = -(-1002 // (chunk * parallel)) * parallel
        assert ssh.commands_run - before == 1 + 1 + loops
        left = ssh.run(["sh", "-c", f'ls -A "$HOME/{JOBS}" | grep -F "{unique}" || true'])
        assert left.stdout == ""
        assert slurm.list_platform_jobs(unique) == {
            o: spec.name for spec, o in zip(specs, outcomes, strict=True)
        }
    finally:
        if made:
            ssh.run(["scancel", *made])


def test_a_waiting_tasks_environment_file_is_refused_to_a_neighbour_by_the_os(
    slurm: SlurmAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    ssh_target: SshTarget,
) -> None:
    # Given a bulk of two held jobs, each with its own key
    specs = held(unique, 2)
    outcomes = slurm.submit_many(specs)
    submitted += arrays_of(outcomes)
    array = listed(ssh, unique)[str(outcomes[0])][0]
    home = Path(f"~{ssh_user(ssh)}").expanduser()
    path = home / JOBS / f"{array}.0.env"
    # Then, read as root, the first task's file holds its key while it waits, the owner's alone
    assert specs[0].environment["KEY"] in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    # and the neighbour (another ordinary account) can neither read it nor put one of his own
    # (another platform URL) where a task reads its environment
    neighbour = next(user for user in sorted(ssh_target.accounts) if user != ssh_user(ssh))
    refused = as_user(neighbour, "cat", str(path))
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert specs[0].environment["KEY"] not in refused.stdout
    planted = f"{path.parent}/{array}.1.env"
    written = as_user(neighbour, "sh", "-c", f"echo ACTIVATE_URL=http://evil > {planted}")
    assert written.returncode != 0 and "Permission denied" in written.stderr
    assert "evil" not in Path(planted).read_text()


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60, cwd="/"
    )

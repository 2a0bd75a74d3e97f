"""SlurmAdapter against the real single-node Slurm cluster over real SSH."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.transport.connection import SSHConnection
from schedulers import slurm as slurm_module
from schedulers.base import JobSpec, Phase, SchedulerError
from schedulers.slurm import SUBMIT_PARALLEL, SlurmAdapter
from tests.conftest import SshTarget
from tests.schedulers.conftest import HOSTILE, NOT_BEFORE_AN_HOUR, has_ended, is_running, wait_for

pytestmark = pytest.mark.slurm


def submit(
    slurm: SlurmAdapter,
    submitted: list[str],
    name: str,
    command: str,
    *,
    partition: str = "",
    directives: tuple[str, ...] = (),
    environment: dict[str, str] | None = None,
) -> str:
    job_id = slurm.submit(
        JobSpec(
            name=name,
            partition=partition,
            directives=list(directives),
            environment=environment or {},
            command=command,
        )
    )
    submitted.append(job_id)
    return job_id


@pytest.fixture(scope="module")
def timeout_job(slurm: SlurmAdapter) -> Iterator[str]:
    """A one-minute job submitted when the module starts, so its end overlaps other tests."""
    job_id = slurm.submit(
        JobSpec(
            name=f"pwtest-{uuid.uuid4().hex[:8]}-timeout",
            partition="",
            directives=["--time=1"],
            command="sleep 600",
        )
    )
    yield job_id
    slurm.cancel(job_id)


@pytest.fixture(autouse=True)
def _start_the_slow_job_first(timeout_job: str) -> None:
    """Every test here pulls in timeout_job, so the clock starts with the first one."""


def test_job_is_queued_then_running_on_a_node_then_cancelled(
    slurm: SlurmAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    ssh_target: SshTarget,
) -> None:
    job_id = submit(slurm, submitted, unique + "sleep", "sleep 300", partition=ssh_target.partition)
    first = slurm.query([job_id]).get(job_id)
    assert first is not None and first.phase in {Phase.QUEUED, Phase.RUNNING}
    assert first.name == unique + "sleep"

    running = wait_for(slurm, job_id, is_running)
    assert running is not None
    hostname = ssh.run(["hostname", "-s"]).stdout.strip()
    assert (running.state, running.node) == ("RUNNING", hostname)

    slurm.cancel(job_id)
    ended = wait_for(slurm, job_id, has_ended)
    assert ended is None or (ended.state, ended.failed) == ("CANCELLED", False)
    final = slurm.final_state(job_id)
    assert final is not None and (final.phase, final.state) == (Phase.ENDED, "CANCELLED")
    slurm.cancel(job_id)  # cancelling an ended job is not an error


def test_job_exiting_3_is_failed_with_exit_code_3(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    job_id = submit(slurm, submitted, unique + "exit3", "exit 3")
    info = wait_for(slurm, job_id, has_ended)
    assert info is not None
    assert (info.state, info.exit_code, info.failed) == ("FAILED", "3:0", True)

    before = ssh.commands_run
    final = slurm.final_state(job_id)
    assert final is not None
    assert (final.state, final.exit_code, final.failed) == ("FAILED", "3:0", True)
    # No accounting here: sacct says so, scontrol answers.
    assert ssh.commands_run - before == 2


def test_find_job_and_platform_jobs_by_name(
    slurm: SlurmAdapter, submitted: list[str], unique: str
) -> None:
    live = submit(slurm, submitted, unique + "live", "sleep 300", directives=(NOT_BEFORE_AN_HOUR,))
    done = submit(slurm, submitted, unique + "done", "true")
    wait_for(slurm, done, has_ended)

    assert slurm.find_job(unique + "live") == live
    assert slurm.find_job(unique + "done") is None
    assert slurm.find_job(unique + "nothing") is None
    assert slurm.list_platform_jobs(unique) == {live: unique + "live"}


def test_a_neighbours_job_of_the_same_name_is_neither_found_nor_listed(
    slurm: SlurmAdapter, submitted: list[str], unique: str, ssh_target: SshTarget
) -> None:
    # Given another Unix user's held job named like ours, a later (higher) id than our own.
    neighbour = sorted(ssh_target.accounts)[-1]
    ours = submit(slurm, submitted, unique + "twin", "sleep 300", directives=(NOT_BEFORE_AN_HOUR,))
    sbatch = ["sbatch", "--parsable", "--hold", f"--job-name={unique}twin", "--output=/dev/null"]
    theirs = subprocess.run(
        ["runuser", "-u", neighbour, "--", *sbatch, "--wrap=sleep 600"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    try:
        assert int(theirs) > int(ours)
        # Then every look-up by name sees our job only.
        assert slurm.find_job(unique + "twin") == ours
        assert slurm.find_jobs([unique + "twin", unique + "none"]) == {unique + "twin": ours}
        assert slurm.list_platform_jobs(unique) == {ours: unique + "twin"}
    finally:
        subprocess.run(["scancel", theirs], check=False, timeout=30)


def test_query_of_200_ids_is_one_command(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    job_id = submit(
        slurm, submitted, unique + "many", "sleep 300", directives=(NOT_BEFORE_AN_HOUR,)
    )
    ids = [job_id] + [str(90_000_000 + n) for n in range(199)]
    before = ssh.commands_run
    result = slurm.query(ids)
    assert ssh.commands_run - before == 1
    assert set(result.jobs) == {job_id}
    info = result.get(job_id)
    assert info is not None and (info.phase, info.reason) == (Phase.QUEUED, "BeginTime")


def test_a_single_unknown_id_is_not_listed(slurm: SlurmAdapter) -> None:
    assert slurm.query(["90000000"]).jobs == {}
    assert slurm.final_state("90000000") is None


def test_partitions_of_the_test_cluster(slurm: SlurmAdapter, ssh_target: SshTarget) -> None:
    partitions = {p.name: p for p in slurm.partitions()}
    default = partitions[ssh_target.partition]
    assert default.is_default and default.nodes_total == 1
    assert partitions["short"].max_time == "1:00:00"
    assert not partitions["short"].is_default


def test_refused_submit_raises_with_slurm_reason(slurm: SlurmAdapter, unique: str) -> None:
    job = JobSpec(name=unique + "bad", partition="no-such-partition", directives=[], command="true")
    with pytest.raises(SchedulerError, match=r"(?i)partition"):
        slurm.submit(job)


def test_hostile_environment_value_reaches_the_job_verbatim(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    out = f"{unique}env.txt"
    job_id = submit(
        slurm,
        submitted,
        unique + "env",
        f'printf "%s" "$HOSTILE" > ~/{out}',
        environment={"HOSTILE": HOSTILE},
    )
    wait_for(slurm, job_id, has_ended)
    try:
        assert ssh.run(["cat", out]).stdout == HOSTILE
        assert ssh.run(["test", "-e", "pwned"]).exit_status == 1
    finally:
        ssh.run(["rm", "-f", out])


def test_time_limit_ends_as_timeout(slurm: SlurmAdapter, timeout_job: str) -> None:
    # Submitted with --time=1 when this module started; Slurm ends it 60-90 s later.
    info = wait_for(slurm, timeout_job, has_ended, timeout=150, interval=2)
    assert info is not None
    assert (info.phase, info.state, info.failed) == (Phase.ENDED, "TIMEOUT", False)
    final = slurm.final_state(timeout_job)
    assert final is not None and final.state == "TIMEOUT"


def test_many_jobs_go_in_a_few_commands_with_one_outcome_each(
    slurm: SlurmAdapter, ssh: SSHConnection, submitted: list[str], unique: str
) -> None:
    # Given 12 jobs, one of them refused by Slurm, one with a hostile environment value
    specs = [
        JobSpec(
            name=f"{unique}batch{n}",
            partition="no-such-partition" if n == 5 else "",
            directives=[NOT_BEFORE_AN_HOUR],
            environment={"HOSTILE": HOSTILE},
            command="sleep 300",
        )
        for n in range(12)
    ]
    # When they are submitted together, one sbatch each
    before = ssh.commands_run
    outcomes = slurm.submit_each(specs)
    submitted += [o for o in outcomes if isinstance(o, str)]
    # Then a few commands at once made eleven jobs, each findable by its name, and the bad one
    # says why
    assert ssh.commands_run - before == min(SUBMIT_PARALLEL, 12)
    assert len(outcomes) == 12
    assert isinstance(outcomes[5], SchedulerError) and "partition" in str(outcomes[5]).lower()
    made = {spec.name: o for spec, o in zip(specs, outcomes, strict=True) if isinstance(o, str)}
    assert len(made) == 11
    before = ssh.commands_run
    assert slurm.find_jobs([spec.name for spec in specs]) == made
    assert ssh.commands_run - before == 1


def test_a_batch_past_one_round_goes_in_equal_shares_each_job_made_once_under_its_name(
    slurm: SlurmAdapter,
    ssh: SSHConnection,
    submitted: list[str],
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given commands of at most 2 scripts, 3 at once, and 13 held jobs: more than one round
    monkeypatch.setattr(slurm_module, "SUBMIT_CHUNK", 2)
    monkeypatch.setattr(slurm_module, "SUBMIT_PARALLEL", 3)
    specs = [
        JobSpec(
            name=f"{unique}share{n}",
            partition="",
            directives=[NOT_BEFORE_AN_HOUR],
            command="sleep 300",
        )
        for n in range(13)
    ]
    # When they are submitted together, one sbatch each
    before = ssh.commands_run
    outcomes = slurm.submit_each(specs)
    submitted += [o for o in outcomes if isinstance(o, str)]
    # Then three rounds of three commands (shares of one or two scripts) made 13 jobs, one per
    # name, each outcome the id of the job of that name
    assert ssh.commands_run - before == 9
    assert all(isinstance(o, str) for o in outcomes)
    names = [spec.name for spec in specs]
    listed = ssh.run(
        ["squeue", "--noheader", "--states=all", "--me", f"--name={','.join(names)}", "-o", "%j %i"]
    ).stdout.split()
    pairs = sorted(zip(listed[::2], listed[1::2], strict=True))
    assert pairs == sorted(zip(names, outcomes, strict=True))


# How the submit loop shows in `ps` when it runs in the login host's Python.
PYTHON_LOOP = "python3 -I -S -c exec("
# The neighbour's watch while the owner submits: the owner's processes' command lines, and their
# environment and stdin (where the submit loops take the scripts).
NEIGHBOUR_WATCH = (
    'while :; do ps -u "$1" -o pid=,args= --width 100000; '
    'for p in $(pgrep -u "$1"); do cat "/proc/$p/environ" "/proc/$p/fd/0" 2>&1 | head -c 65536; '
    "echo; done; done"
)
# Root holds each of the owner's submit loops and sbatch it finds (SIGSTOP, until the kernel
# shows it stopped, so it cannot exit) while the neighbour reads its command line, environment
# and stdin; the read meets a live process, never one that has just exited ("No such file").
HOLD_AND_READ = r"""
trap 'kill -CONT "$p" 2>/dev/null; exit' TERM
while :; do
  for p in $(pgrep -u "$1" -f '^(python3 -I -S -c exec\(|sbatch )'); do
    kill -STOP "$p" 2>/dev/null || continue
    for _ in $(seq 100); do
      state=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
      case "$state" in T|Z|"") break;; esac
      sleep 0.01
    done
    if [ "$state" = T ]; then
      echo "@@held $p"
      runuser -u "$2" -- sh -c 'ps -ww -o args= -p "$1"; cat "/proc/$1/environ" "/proc/$1/fd/0"' \
        - "$p" 2>&1 | head -c 65536
      echo; echo "@@released $p"
    fi
    kill -CONT "$p" 2>/dev/null
  done
done
"""


def held_reads(log: str) -> list[tuple[str, str]]:
    """(pid, what the neighbour got) for each process HOLD_AND_READ held while it read."""
    return re.findall(r"^@@held (\d+)\n(.*?)^@@released \1$", log, re.MULTILINE | re.DOTALL)


def refused(pid: str, read: str) -> bool:
    return all(f"/proc/{pid}/{name}: Permission denied" in read for name in ("environ", "fd/0"))


def test_a_neighbour_watching_the_submit_loops_at_once_gets_no_script_and_no_secret(
    slurm: SlurmAdapter, ssh_target: SshTarget, submitted: list[str], unique: str, tmp_path: Path
) -> None:
    # Given another ordinary user of the login host watching, as that user (never root)
    neighbour = next(a for a in sorted(ssh_target.accounts) if a != ssh_target.user)
    keys: list[str] = []
    log, held = tmp_path / "seen", tmp_path / "held"
    with log.open("wb") as out, held.open("wb") as held_out:
        watcher = subprocess.Popen(
            ["runuser", "-u", neighbour, "--", "bash", "-c", NEIGHBOUR_WATCH, "-", ssh_target.user],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        holder = subprocess.Popen(
            ["bash", "-c", HOLD_AND_READ, "-", ssh_target.user, neighbour],
            stdout=held_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def loop_read_while_held() -> bool:
        reads = held_reads(held.read_text(errors="replace"))
        return any(PYTHON_LOOP in read for _, read in reads)

    try:
        # When the owner's jobs go in SUBMIT_PARALLEL loops at once, until the neighbour has
        # read a loop held still (a few rounds at most)
        for round_ in range(20):
            batch = [f"neighbourtest{uuid.uuid4().hex}" for _ in range(2 * SUBMIT_PARALLEL)]
            keys += batch
            specs = [
                JobSpec(
                    name=f"{unique}watched{round_}x{n}",
                    partition="",
                    directives=[NOT_BEFORE_AN_HOUR],
                    environment={"ACTIVATE_AGENT_KEY": key},
                    command="sleep 300",
                )
                for n, key in enumerate(batch)
            ]
            outcomes = slurm.submit_each(specs)
            submitted += [o for o in outcomes if isinstance(o, str)]
            assert all(isinstance(o, str) for o in outcomes), outcomes
            if loop_read_while_held():
                break
    finally:
        for process in (holder, watcher):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    seen, held_seen = log.read_text(errors="replace"), held.read_text(errors="replace")
    reads = held_reads(held_seen)
    # Then the neighbour read a loop running in the login host's Python while it was held alive:
    # its command line is listed, and the kernel refused its environment and stdin; so it went
    # for every loop and sbatch held, and no key was seen, held or not
    loops = [(pid, read) for pid, read in reads if PYTHON_LOOP in read]
    assert loops and slurm_module.SUBMIT_MARKER in loops[0][1], held_seen[-4000:]
    assert [pid for pid, read in reads if not refused(pid, read)] == [], held_seen[-4000:]
    assert not [key for key in keys if key in seen or key in held_seen]

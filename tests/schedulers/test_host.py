"""HostAdapter: parsing, and jobs as detached process groups on the test SSH server."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from core.transport.connection import SSHConnection
from harness.waiting import wait_until
from schedulers.base import JobSpec, Phase, QueryFailed, SchedulerError
from schedulers.host import HostAdapter, parse_header, parse_listing
from tests.schedulers.conftest import FakeRunner, failed, has_ended, is_running, ok, wait_for

HOSTILE = 'it\'s "quoted" $(touch ~/pwned) `id` ; rm -rf ~ \n second line \\ end'


def job(name: str = "job-1", walltime: str | None = "00:00:30", command: str = "true") -> JobSpec:
    directives = [f"--time={walltime}"] if walltime else []
    return JobSpec(name=name, partition="", directives=directives, command=command)


def script(name: str = "job-1", walltime: str | None = "00:00:30", command: str = "true") -> str:
    return HostAdapter(FakeRunner()).render_script(job(name, walltime, command))


# -- parsing --------------------------------------------------------------------------------


def test_header_gives_name_and_time_limit() -> None:
    assert parse_header(script("w-1", "01:02:03")) == ("w-1", 3723)
    assert parse_header(script("w-2", None)) == ("w-2", 0)


def test_header_without_a_name_is_refused() -> None:
    with pytest.raises(SchedulerError):
        parse_header("#!/bin/bash\n#ACTIVATE --time=00:01:00\ntrue\n")


@pytest.mark.parametrize(
    "directive", ["--time=1:00", "--time=01:00:00;id", "--mem=1G", "--time=01:60:00"]
)
def test_only_hh_mm_ss_time_limits_are_accepted(directive: str) -> None:
    with pytest.raises(SchedulerError):
        HostAdapter(FakeRunner()).render_script(
            JobSpec(name="x", partition="", directives=[directive], command="true")
        )


def test_listing_of_every_kind_of_job() -> None:
    host, jobs = parse_listing(
        "host\tbox1\n"
        "job\ta\t1\t\t\tw-run\n"
        "job\tb\t0\t0\t\tw-ok\n"
        "job\tc\t0\t3\t\tw-bad\n"
        "job\td\t0\t124\ttimedout,\tw-slow\n"
        "job\te\t0\t143\tcancelled,\tw-stop\n"
        "job\tf\t0\t\t\tw-lost\n"
        "job\tg\t0\t124\t\tw-own-124\n"
        "end\n"
    )
    assert host == "box1"
    summary = {i.name: (i.phase, i.state, i.exit_code, i.failed) for i in jobs.values()}
    assert summary == {
        "w-run": (Phase.RUNNING, "RUNNING", "", False),
        "w-ok": (Phase.ENDED, "COMPLETED", "0", False),
        "w-bad": (Phase.ENDED, "FAILED", "3", True),
        "w-slow": (Phase.ENDED, "TIMEOUT", "124", False),
        "w-stop": (Phase.ENDED, "CANCELLED", "143", False),
        "w-lost": (Phase.ENDED, "LOST", "", True),
        # The script itself exited 124 before its limit: a failure, not a timeout.
        "w-own-124": (Phase.ENDED, "FAILED", "124", True),
    }
    assert jobs["a"].node == "box1"


@pytest.mark.parametrize(
    "stdout",
    ["host\tbox1\njob\ta\t1\t\t\tw\n", "", "job\ta\tyes\t\t\tw\nend\n", "job\ta\t1\nend\n"],
    ids=["cut-off", "empty", "bad-alive", "short-line"],
)
def test_unreadable_listing_fails_the_query(stdout: str) -> None:
    with pytest.raises(QueryFailed):
        HostAdapter(FakeRunner().on("sh", ok(stdout))).query(["a"])


def test_failed_listing_command_fails_the_query() -> None:
    with pytest.raises(QueryFailed):
        HostAdapter(FakeRunner().on("sh", failed("sh: 1: cannot fork\n", 2))).query(["a"])


def test_query_refuses_ids_that_could_escape_the_jobs_directory() -> None:
    with pytest.raises(ValueError):
        HostAdapter(FakeRunner()).query(["../../etc"])


def test_partitions_is_the_one_local_machine() -> None:
    runner = FakeRunner()
    [partition] = HostAdapter(runner).partitions()
    assert (partition.name, partition.nodes_total, partition.is_default) == ("local", 1, True)
    assert runner.calls == []


# -- on the test SSH server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def host(ssh: SSHConnection) -> HostAdapter:
    return HostAdapter(ssh)


@pytest.fixture
def started(host: HostAdapter, ssh: SSHConnection) -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for job_id in ids:
        host.cancel(job_id)
    if ids:
        ssh.run(["rm", "-rf", *(f".activate-jobs/{job_id}" for job_id in ids)])


@pytest.mark.slurm
def test_job_runs_on_the_host_and_is_cancelled_with_its_children(
    host: HostAdapter, ssh: SSHConnection, started: list[str], unique: str
) -> None:
    # The job starts a grandchild: cancelling must end the whole process group.
    job_id = host.submit(job(unique + "run", "00:10:00", "sleep 300 & sleep 300; wait"))
    started.append(job_id)
    info = host.query([job_id]).get(job_id)
    assert info is not None and (info.phase, info.name) == (Phase.RUNNING, unique + "run")
    assert info.node == ssh.run(["uname", "-n"]).stdout.strip()
    assert host.find_job(unique + "run") == job_id
    assert host.list_platform_jobs(unique) == {job_id: unique + "run"}

    pgid = ssh.run(["cat", f".activate-jobs/{job_id}/pid"]).stdout.strip()
    host.cancel(job_id)
    ended = host.query([job_id]).get(job_id)
    assert ended is not None and (ended.phase, ended.state) == (Phase.ENDED, "CANCELLED")
    assert ssh.run(["sh", "-c", f"kill -0 -{pgid}"]).exit_status != 0
    assert host.find_job(unique + "run") is None
    final = host.final_state(job_id)
    assert final is not None and final.state == "CANCELLED"


@pytest.mark.slurm
def test_exit_status_and_failure(host: HostAdapter, started: list[str], unique: str) -> None:
    good = host.submit(job(unique + "ok", command="true"))
    bad = host.submit(job(unique + "bad", command="exit 3"))
    started += [good, bad]
    assert wait_for(host, good, has_ended, timeout=10, interval=0.2) is not None
    info = wait_for(host, bad, has_ended, timeout=10, interval=0.2)
    assert info is not None and (info.state, info.exit_code, info.failed) == ("FAILED", "3", True)
    final = host.final_state(good)
    assert final is not None and (final.state, final.exit_code, final.failed) == (
        "COMPLETED",
        "0",
        False,
    )


@pytest.mark.slurm
def test_wall_time_limit_ends_the_job_as_timeout(
    host: HostAdapter, started: list[str], unique: str
) -> None:
    job_id = host.submit(job(unique + "slow", "00:00:02", "sleep 60"))
    started.append(job_id)
    assert is_running(host.query([job_id]).get(job_id))
    info = wait_for(host, job_id, has_ended, timeout=15, interval=0.5)
    assert info is not None
    assert (info.state, info.exit_code, info.failed) == ("TIMEOUT", "124", False)


@pytest.mark.slurm
def test_query_of_many_ids_is_one_command(
    host: HostAdapter, ssh: SSHConnection, started: list[str], unique: str
) -> None:
    job_id = host.submit(job(unique + "q", "00:01:00", "sleep 30"))
    started.append(job_id)
    ids = [job_id] + [f"nosuchjob-{n}" for n in range(199)]
    before = ssh.commands_run
    result = host.query(ids)
    assert ssh.commands_run - before == 1
    assert set(result.jobs) == {job_id}


@pytest.mark.slurm
def test_hostile_environment_value_reaches_the_host_job_verbatim(
    host: HostAdapter, ssh: SSHConnection, started: list[str], unique: str
) -> None:
    job_id = host.submit(
        JobSpec(
            name=unique + "env",
            partition="",
            directives=["--time=00:01:00"],
            environment={"HOSTILE": HOSTILE},
            command='printf "%s" "$HOSTILE"',
        )
    )
    started.append(job_id)
    wait_for(host, job_id, has_ended, timeout=10, interval=0.2)
    assert ssh.run(["cat", f".activate-jobs/{job_id}/output"]).stdout == HOSTILE
    assert ssh.run(["test", "-e", "pwned"]).exit_status == 1


@pytest.mark.slurm
def test_cancel_of_an_unknown_or_ended_job_is_not_an_error(host: HostAdapter) -> None:
    host.cancel("nosuchjob")
    assert host.query(["nosuchjob"]).jobs == {}
    assert host.final_state("nosuchjob") is None


@pytest.mark.slurm
def test_a_neighbours_process_on_the_wrappers_old_pid_neither_holds_a_cancel_nor_is_killed(
    host: HostAdapter, ssh: SSHConnection, started: list[str], unique: str
) -> None:
    # Given: a running job whose wrapper's pid now names a process of pwbob's (a pid reused).
    job_id = host.submit(job(unique + "reused", "00:10:00", "sleep 300"))
    started.append(job_id)
    bob = subprocess.Popen(["runuser", "-u", "pwbob", "--", "sleep", "60"])
    try:
        assert wait_until(
            lambda: subprocess.run(["pgrep", "-u", "pwbob", "-x", "sleep"]).returncode == 0,
            timeout=10,
        )
        bobs = subprocess.run(
            ["pgrep", "-n", "-u", "pwbob", "-x", "sleep"], capture_output=True, text=True
        ).stdout.strip()
        ssh.run(["sh", "-c", f"echo {bobs} > .activate-jobs/{job_id}/wrapper"])
        # When: the job is cancelled. Then: the wait for the wrapper does not wait on bob's
        # process (kill -0 is refused across users), and bob's process lives on.
        took = time.monotonic()
        host.cancel(job_id)
        took = time.monotonic() - took
        assert took < 5, took
        assert subprocess.run(["kill", "-0", bobs]).returncode == 0
    finally:
        bob.kill()
        bob.wait()

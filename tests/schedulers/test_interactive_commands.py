"""The login host's command line for a terminal or a streamed command inside a job, per
scheduler. (The Slurm line runs for real in tests/e2e/test_terminal.py.)"""

from __future__ import annotations

import shlex

import pytest

from schedulers.base import SchedulerError
from schedulers.host import HostAdapter
from schedulers.pbs import PbsAdapter
from schedulers.slurm import SlurmAdapter
from tests.schedulers.conftest import FakeRunner, data, ok


def test_slurm_opens_a_pty_step_in_the_job_with_the_users_own_login_shell() -> None:
    line = SlurmAdapter(FakeRunner()).interactive_command("4242", [], pty=True)
    assert line == 'srun --jobid=4242 --overlap --ntasks=1 --pty -- "${SHELL:-/bin/sh}" -l'


def test_slurm_streams_a_command_quoted_once_and_without_a_pty() -> None:
    line = SlurmAdapter(FakeRunner()).interactive_command("4242", ["echo", "$(id); a'b"], pty=False)
    assert shlex.split(line) == [
        "srun",
        "--jobid=4242",
        "--overlap",
        "--ntasks=1",
        "--",
        "echo",
        "$(id); a'b",
    ]


@pytest.mark.parametrize("job_id", ["42; rm -rf ~", "", "4242 --uid=0"])
def test_a_job_id_that_is_not_one_is_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="job id"):
        SlurmAdapter(FakeRunner()).interactive_command(job_id, [], pty=True)
    with pytest.raises(ValueError, match="job id"):
        HostAdapter(FakeRunner()).interactive_command(job_id, [], pty=True)


def test_pbs_goes_to_the_node_the_scheduler_reports_with_a_tty_when_asked() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    adapter = PbsAdapter(runner)
    assert shlex.split(adapter.interactive_command("1003.pbs01", [], pty=True)) == [
        "ssh",
        "-tt",
        "-o",
        "BatchMode=yes",
        "cn017",
    ]
    streamed = shlex.split(adapter.interactive_command("1003.pbs01", ["echo", "a b"], pty=False))
    # The node's shell parses the command once more: it goes as one quoted word.
    assert streamed == ["ssh", "-T", "-o", "BatchMode=yes", "cn017", "--", "echo 'a b'"]


def test_pbs_refuses_a_job_that_is_not_running_on_a_node() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    with pytest.raises(SchedulerError, match="not running"):
        PbsAdapter(runner).interactive_command("1001.pbs01", [], pty=True)


def test_a_plain_host_runs_the_shell_or_the_command_where_it_is_marked_as_the_jobs() -> None:
    adapter = HostAdapter(FakeRunner())
    assert (
        adapter.interactive_command("12345", [], pty=True)
        == 'export ACTIVATE_JOB_ID=12345; exec "${SHELL:-/bin/sh}" -l'
    )
    line = adapter.interactive_command("12345", ["ls", "-l"], pty=False)
    assert line == "env ACTIVATE_JOB_ID=12345 ls -l"

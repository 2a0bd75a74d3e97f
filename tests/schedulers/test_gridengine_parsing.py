"""GridEngineAdapter's parsers and command lines, fed output recorded from the real cell
(data/gridengine_*); the cell itself answers in test_gridengine_cluster.py."""

from __future__ import annotations

import shlex

import pytest

from schedulers.base import JobSpec, Phase, QueryFailed, SchedulerError, SchedulerUnavailable
from schedulers.gridengine import (
    SUBMIT_MARKER,
    GridEngineAdapter,
    parse_qacct,
    parse_qstat,
    parse_queue_limits,
    parse_queue_summary,
    state_of,
)
from tests.schedulers.conftest import FakeRunner, data, failed, ok


def test_running_and_held_jobs_of_qstat_xml() -> None:
    jobs = parse_qstat(data("gridengine_qstat.xml"))
    running, held = jobs["10"], jobs["9"]
    assert (running.name, running.phase, running.state, running.node) == (
        "rdata",
        Phase.RUNNING,
        "RUNNING",
        "vm",
    )
    assert (held.name, held.phase, held.state, held.node) == ("hdata", Phase.QUEUED, "HELD", "")


@pytest.mark.parametrize(
    ("letters", "state", "phase"),
    [
        ("qw", "PENDING", Phase.QUEUED),
        ("hqw", "HELD", Phase.QUEUED),
        ("Eqw", "ERROR", Phase.QUEUED),
        ("r", "RUNNING", Phase.RUNNING),
        ("t", "TRANSFERRING", Phase.RUNNING),
        ("Rr", "RUNNING", Phase.RUNNING),
        ("s", "SUSPENDED", Phase.QUEUED),
        ("dr", "DELETING", Phase.RUNNING),
        ("dqw", "DELETING", Phase.QUEUED),
        ("z", "FINISHED", Phase.ENDED),
        ("Q", "Q", Phase.QUEUED),  # unknown: kept live, never guessed ended
    ],
)
def test_state_letters(letters: str, state: str, phase: Phase) -> None:
    assert state_of(letters) == (state, phase)


def test_qstat_output_that_is_not_xml_or_not_a_job_fails_the_query() -> None:
    with pytest.raises(QueryFailed):
        parse_qstat("error: commlib error")
    bad = data("gridengine_qstat.xml").replace("<JB_job_number>10<", "<JB_job_number>x<")
    with pytest.raises(QueryFailed):
        parse_qstat(bad)


def test_the_wall_time_kill_is_timeout_and_a_tasks_record_is_not_the_jobs() -> None:
    # Job 4 ran one task through qrsh -inherit (it exited 4) before h_rt=20 killed the job.
    info = parse_qacct(data("gridengine_qacct_timeout.txt"), "4")
    assert info is not None
    assert (info.phase, info.state, info.exit_code, info.failed) == (
        Phase.ENDED,
        "TIMEOUT",
        "137",
        False,
    )
    assert info.reason.startswith("37")


def test_a_deleted_job_is_killed_and_an_exit_3_failed() -> None:
    deleted = parse_qacct(data("gridengine_qacct_deleted.txt"), "6")
    assert deleted is not None
    assert (deleted.state, deleted.exit_code, deleted.failed) == ("KILLED", "137", False)
    exit3 = parse_qacct(data("gridengine_qacct_exit3.txt"), "5")
    assert exit3 is not None and (exit3.state, exit3.exit_code, exit3.failed) == (
        "FAILED",
        "3",
        True,
    )
    assert parse_qacct(data("gridengine_qacct_exit3.txt"), "55") is None


def test_a_memory_limit_is_not_a_timeout() -> None:
    record = data("gridengine_qacct_timeout.txt").replace("ru_wallclock 21s", "ru_wallclock 2s")
    info = parse_qacct(record, "4")
    assert info is not None and (info.state, info.failed) == ("LIMIT_EXCEEDED", True)


def test_queues_with_their_slots() -> None:
    (queue,) = parse_queue_summary(data("gridengine_queues.xml"))
    assert (queue.name, queue.nodes_total, queue.nodes_available) == ("all.q", 64, 63)


def test_queue_limits() -> None:
    assert parse_queue_limits(data("gridengine_queue_config.txt")) == {"all.q": ""}
    limited = data("gridengine_queue_config.txt").replace(
        "h_rt                  INFINITY", "h_rt 8:00:00"
    )
    assert parse_queue_limits(limited) == {"all.q": "8:00:00"}


def spec(**changes: object) -> JobSpec:
    values: dict[str, object] = {
        "name": "pw-worker-x-abc",
        "partition": "all.q",
        "directives": ["-l h_rt=01:00:00"],
        "environment": {"ACTIVATE_AGENT_KEY": "s3cret", "ODD": "it's $(id)"},
        "command": "exec agent",
    }
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["../../.ssh/authorized_keys", "a/b", "9starts-with-a-digit"])
def test_a_job_name_that_could_leave_the_environment_folder_is_refused(name: str) -> None:
    runner = FakeRunner()
    with pytest.raises(SchedulerError, match="not one Grid Engine takes"):
        GridEngineAdapter(runner).submit(spec(name=name))
    assert runner.calls == []


def test_a_parallel_environment_of_the_users_own_replaces_the_default() -> None:
    script = GridEngineAdapter(FakeRunner()).render_script(spec(directives=["-pe mpi 4"]))
    assert "#$ -pe mpi 4\n" in script and "-pe smp" not in script


@pytest.mark.parametrize(
    ("directive", "allowed"),
    [
        ("-l h_vmem=4G", True),
        ("-pe smp 4", True),
        ("-A proj1", True),
        ("-l h_vmem=4G,h_rt=10", False),  # two resources in one line
        ("-v SECRET=x", False),
        ("-N other", False),
        ("-q other.q", False),
        ("-t 1-10", False),
        ("-l mf=1G", False),  # a resource's shortcut is not its name
        ("-pe smp", False),
        ("-A proj1 extra", False),
    ],
)
def test_directives_users_may_set(directive: str, allowed: bool) -> None:
    problem = GridEngineAdapter.directive_problem(directive, set_by_fields={})
    assert (problem is None) == allowed, problem


def test_qsub_refusal_and_an_unreachable_qmaster() -> None:
    said = 'Unable to run job: job requests unknown queue "x"'
    refused = FakeRunner().on("sh", ok(f"{said}\nExiting.\n{SUBMIT_MARKER} 1\n"))
    with pytest.raises(SchedulerError, match="unknown queue") as caught:
        GridEngineAdapter(refused).submit(spec())
    assert type(caught.value) is SchedulerError
    said = 'unable to contact qmaster using port 6444 on host "vm"'
    down = FakeRunner().on("sh", ok(f"{said}\n{SUBMIT_MARKER} 1\n"))
    with pytest.raises(SchedulerUnavailable):
        GridEngineAdapter(down).submit(spec())


def test_qdel_of_a_job_that_is_gone_is_done_and_another_refusal_is_not() -> None:
    gone = FakeRunner().on("qdel", failed("", stdout='denied: job "6" does not exist'))
    GridEngineAdapter(gone).cancel("6")
    denied = FakeRunner().on(
        "qdel",
        failed("", stdout='pwbob - you do not have the necessary privileges to delete the job "6"'),
    )
    with pytest.raises(SchedulerError, match="privileges"):
        GridEngineAdapter(denied).cancel("6")


def test_a_job_gone_from_accounting_and_the_zombie_list_is_unknown() -> None:
    runner = (
        FakeRunner()
        .on("qacct", failed("error: job id 77 not found"))
        .on("sh", ok("<?xml version='1.0'?><job_info><queue_info/><job_info/></job_info>"))
    )
    assert GridEngineAdapter(runner).final_state("77") is None


def test_a_zombie_not_yet_in_accounting_is_asked_again_later() -> None:
    zombie = (
        "<job_info><job_info><job_list state='zombie'><JB_job_number>77</JB_job_number>"
        "<JB_name>n</JB_name><state>z</state></job_list></job_info></job_info>"
    )
    runner = FakeRunner().on("qacct", failed("error: job id 77 not found")).on("sh", ok(zombie))
    with pytest.raises(QueryFailed, match="not written yet"):
        GridEngineAdapter(runner).final_state("77")
    off = (
        FakeRunner()
        .on(
            "qacct",
            failed("/var/lib/gridengine/default/common/accounting: No such file or directory"),
        )
        .on("sh", ok(zombie))
    )
    info = GridEngineAdapter(off).final_state("77")
    assert info is not None and (info.phase, info.state, info.exit_code) == (
        Phase.ENDED,
        "FINISHED",
        "",
    )


def test_a_terminal_is_a_task_of_the_job_with_a_pty_made_on_the_node() -> None:
    runner = FakeRunner().on("sh", ok(data("gridengine_qstat.xml")))
    line = GridEngineAdapter(runner).interactive_command("10", [], pty=True)
    argv = shlex.split(line)
    assert argv[:6] == ["env", "JOB_ID=10", "SGE_TASK_ID=undefined", "qrsh", "-inherit", "vm"]
    assert shlex.split(argv[6]) == [
        "exec",
        "script",
        "-qfec",
        'exec "${SHELL:-/bin/sh}" -l',
        "/dev/null",
    ]
    with pytest.raises(SchedulerError, match="not running"):
        GridEngineAdapter(runner).interactive_command("9", ["true"], pty=False)


def test_task_failures_are_qrshs_own_words() -> None:
    said = (
        'error: executing task of job 6 failed: execution daemon on host "vm" didn\'t accept task'
    )
    assert GridEngineAdapter.interactive_failure(f"hello\n{said}\n") == said
    assert GridEngineAdapter.interactive_failure("error: my program failed\n") is None

"""PbsAdapter parsing. No PBS server can run here: the JSON under data/pbs_*.json is written
from PBS Pro's documented ``-F json`` formats and from outputs published by PBS sites."""

from __future__ import annotations

import json
import re

import pytest

from schedulers.base import JobSpec, Phase, QueryFailed, SchedulerError
from schedulers.pbs import PbsAdapter, parse_partitions
from tests.schedulers.conftest import FakeRunner, data, failed, ok

ALL_JOBS = [f"{n}.pbs01" for n in range(1001, 1014)]


def query_all() -> dict[str, tuple[Phase, str, str, bool, str]]:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    result = PbsAdapter(runner).query(ALL_JOBS)
    return {
        info.name.removeprefix("pw-worker-"): (
            info.phase,
            info.state,
            info.exit_code,
            info.failed,
            info.node,
        )
        for info in result.jobs.values()
    }


def test_every_job_state_letter_and_end_reason() -> None:
    assert query_all() == {
        "queued": (Phase.QUEUED, "QUEUED", "", False, ""),
        "held": (Phase.QUEUED, "HELD", "", False, ""),
        "running": (Phase.RUNNING, "RUNNING", "", False, "cn017"),
        "exiting": (Phase.RUNNING, "EXITING", "", False, "cn019"),
        "done": (Phase.ENDED, "COMPLETED", "0", False, "cn020"),
        "exit3": (Phase.ENDED, "FAILED", "3", True, "cn021"),
        "walltime": (Phase.ENDED, "TIMEOUT", "-29", False, "cn022"),
        "deleted-running": (Phase.ENDED, "KILLED", "271", False, "cn023"),
        "deleted-queued": (Phase.ENDED, "CANCELLED", "", False, ""),
        "oom": (Phase.ENDED, "OUT_OF_MEMORY", "-27", True, "cn024"),
        "suspended": (Phase.QUEUED, "SUSPENDED", "", False, "cn025"),
        "waiting": (Phase.QUEUED, "WAITING", "", False, ""),
        "moved": (Phase.QUEUED, "MOVED", "", False, ""),
    }


def test_query_is_one_qstat_with_history_for_all_ids() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    PbsAdapter(runner).query(ALL_JOBS)
    assert len(runner.calls) == 1
    argv = runner.calls[0][0]
    assert argv[:5] == ["qstat", "-f", "-F", "json", "-x"]
    assert sorted(argv[5:]) == sorted(ALL_JOBS)


def test_reason_comes_from_the_comment() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    info = PbsAdapter(runner).query(["1001.pbs01"]).get("1001.pbs01")
    assert info is not None
    assert info.reason == "Not Running: Insufficient amount of resource: ncpus"


def test_ids_without_the_server_suffix_match() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    result = PbsAdapter(runner).query(["1003"])
    assert set(result.jobs) == {"1003"}
    info = result.get("1003")
    assert info is not None and info.state == "RUNNING"


def test_unknown_ids_are_not_listed_and_the_others_are() -> None:
    stdout = json.dumps(
        {"Jobs": {"1003.pbs01": json.loads(data("pbs_qstat_jobs.json"))["Jobs"]["1003.pbs01"]}}
    )
    runner = FakeRunner().on(
        "qstat", failed("qstat: Unknown Job Id 1999.pbs01\n", exit_status=153, stdout=stdout)
    )
    result = PbsAdapter(runner).query(["1003.pbs01", "1999.pbs01"])
    assert set(result.jobs) == {"1003.pbs01"}


def test_only_unknown_ids_give_an_empty_answer() -> None:
    runner = FakeRunner().on("qstat", failed("qstat: Unknown Job Id 1999.pbs01\n", 153))
    assert PbsAdapter(runner).query(["1999.pbs01"]).jobs == {}


@pytest.mark.parametrize(
    "result",
    [
        failed("Connection refused\nqstat: cannot connect to server pbs01 (errno=111)\n", 2),
        failed("qstat: Unknown Job Id 5.pbs01\n", 153),  # an id we did not ask about
        failed("", 1),
        ok('{"Jobs": {"1003.pbs01": {"Job_Name": "x", "job_state": "R"'),  # cut off
        ok('{"Jobs": ["1003.pbs01"]}'),
        ok('{"Jobs": {"1003.pbs01": {"Job_Name": "x"}}}'),  # no job_state
        ok('{"Jobs": {"1003.pbs01": {"job_state": "F", "Exit_status": "odd"}}}'),
    ],
)
def test_failed_or_garbled_qstat_raises_query_failed(result: object) -> None:
    runner = FakeRunner().on("qstat", result)  # type: ignore[arg-type]
    with pytest.raises(QueryFailed):
        PbsAdapter(runner).query(["1003.pbs01"])


def test_unknown_state_letter_stays_live(caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeRunner().on("qstat", ok('{"Jobs": {"7.s": {"Job_Name": "x", "job_state": "Z"}}}'))
    info = PbsAdapter(runner).query(["7.s"]).get("7.s")
    assert info is not None and info.phase is Phase.QUEUED
    assert "Z" in caplog.text


def test_final_state_of_a_finished_job_and_of_a_forgotten_one() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json")))
    info = PbsAdapter(runner).final_state("1006.pbs01")
    assert info is not None and (info.state, info.exit_code) == ("FAILED", "3")
    runner = FakeRunner().on("qstat", failed("qstat: Unknown Job Id 1999.pbs01\n", 153))
    assert PbsAdapter(runner).final_state("1999.pbs01") is None


def test_submit_sends_the_script_on_stdin_name_queue_and_output_on_the_command_line() -> None:
    runner = FakeRunner().on("qsub", ok("1014.pbs01\n"))
    adapter = PbsAdapter(runner)
    assert adapter.submit(spec()) == "1014.pbs01"
    argv, stdin = runner.calls[0]
    assert argv == ["qsub", "-N", "pw-worker-w2abc", "-j", "oe", "-o", "/dev/null", "-q", "workq"]
    assert stdin == adapter.render_script(spec())


def test_refused_submit_raises_with_qsub_message() -> None:
    runner = FakeRunner().on("qsub", failed("qsub: Unknown queue\n", 168))
    with pytest.raises(SchedulerError, match="Unknown queue"):
        PbsAdapter(runner).submit(spec())


def test_find_job_uses_qselect_by_name_among_the_accounts_own_jobs() -> None:
    runner = FakeRunner().on("sh", ok("1003.pbs01\n"))
    assert PbsAdapter(runner).find_job("pw-worker-running") == "1003.pbs01"
    [(argv, _)] = runner.calls
    # A neighbour's job of the same name is never looked at: qselect -u names the account.
    assert argv[:2] == ["sh", "-c"]
    assert 'qselect -u "$(id -un)" -N "$1"' in argv[2]
    assert argv[-1] == "pw-worker-running"
    assert PbsAdapter(FakeRunner().on("sh", ok(""))).find_job("pw-worker-x") is None
    with pytest.raises(QueryFailed):
        PbsAdapter(FakeRunner().on("sh", failed("qselect: cannot connect\n", 2))).find_job(
            "pw-worker-x"
        )


@pytest.mark.parametrize(
    "result",
    [ok(), failed("qdel: Unknown Job Id 5.s\n", 153), failed("qdel: Job has finished\n", 35)],
)
def test_cancel_of_live_or_gone_job_succeeds(result: object) -> None:
    PbsAdapter(FakeRunner().on("qdel", result)).cancel("5.s")  # type: ignore[arg-type]


def test_cancel_refused_raises() -> None:
    with pytest.raises(SchedulerError):
        PbsAdapter(FakeRunner().on("qdel", failed("qdel: Unauthorized Request\n", 159))).cancel(
            "5.s"
        )


def test_list_platform_jobs_of_the_account() -> None:
    runner = (
        FakeRunner()
        .on("sh", ok("1001.pbs01\n1003.pbs01\n1005.pbs01\n"))
        .on("qstat", ok(data("pbs_qstat_jobs.json")))
    )
    jobs = PbsAdapter(runner).list_platform_jobs("pw-worker-")
    assert jobs == {"1001.pbs01": "pw-worker-queued", "1003.pbs01": "pw-worker-running"}
    assert 'qselect -u "$(id -un)"' in runner.calls[0][0][2]


def test_partitions_from_queues_nodes_and_server_default() -> None:
    partitions = {
        p.name: p
        for p in parse_partitions(
            json.loads(data("pbs_queues.json")),
            json.loads(data("pbs_nodes.json")),
            json.loads(data("pbs_server.json")),
        )
    }
    assert set(partitions) == {"workq", "gpu", "closed"}
    workq, gpu, closed = partitions["workq"], partitions["gpu"], partitions["closed"]
    assert (workq.nodes_total, workq.nodes_available, workq.is_default) == (4, 2, True)
    assert workq.max_time == "24:00:00"
    assert (gpu.nodes_total, gpu.nodes_available, gpu.is_default) == (2, 1, False)
    assert (closed.nodes_total, closed.nodes_available) == (4, 0)


def test_partitions_runs_three_commands() -> None:
    runner = (
        FakeRunner()
        .on("qstat", ok(data("pbs_queues.json")), ok(data("pbs_server.json")))
        .on("pbsnodes", ok(data("pbs_nodes.json")))
    )
    assert len(PbsAdapter(runner).partitions()) == 3
    assert runner.programs == ["qstat", "pbsnodes", "qstat"]


def spec(**overrides: object) -> JobSpec:
    values: dict[str, object] = {
        "name": "pw-worker-w2abc",
        "partition": "workq",
        "directives": ["-l walltime=04:00:00", "-A proj1"],
        "environment": {"ACTIVATE_WORKER_ID": "w2abc"},
        "command": "exec sleep 10",
    }
    values.update(overrides)
    return JobSpec(**values)  # type: ignore[arg-type]


def test_rendered_script() -> None:
    assert PbsAdapter(FakeRunner()).render_script(spec()).splitlines() == [
        "#!/bin/bash",
        "#PBS -N pw-worker-w2abc",
        "#PBS -q workq",
        "#PBS -j oe",
        "#PBS -o /dev/null",
        "#PBS -l select=1",
        "#PBS -l walltime=04:00:00",
        "#PBS -A proj1",
        "export ACTIVATE_WORKER_ID=w2abc",
        'export ACTIVATE_JOB_ID="${PBS_JOBID:-}"',
        "export ACTIVATE_JOB_VARIABLE=PBS_JOBID",
        "exec sleep 10",
    ]


def test_user_select_replaces_the_default() -> None:
    script = PbsAdapter(FakeRunner()).render_script(spec(directives=["-l select=3"]))
    assert "-l select=1" not in script and "#PBS -l select=3" in script


@pytest.mark.parametrize(
    "directive",
    [
        "-N other",
        "-o /tmp/x",
        "-q vip",
        "-J 1-10",
        "-I",
        "-W block=true",
        "-W group_list=g1",
        "-v SECRET=x",
        "-V",
        "-l mem=1gb\nid",
        "-l x=$(id)",
        "-l mem=1gb,walltime=99:00:00",
    ],
)
def test_directives_that_could_inject_or_untrack_are_refused(directive: str) -> None:
    with pytest.raises(SchedulerError):
        PbsAdapter(FakeRunner()).render_script(spec(directives=[directive]))


@pytest.mark.parametrize("directive", ["-l mem=4gb", "-l select=2:ncpus=8", "-r n", "-m abe"])
def test_ordinary_pbs_directives_are_accepted(directive: str) -> None:
    assert PbsAdapter.directive_problem(directive, set_by_fields={}) is None


@pytest.mark.parametrize(
    ("directive", "option"),
    [("-A other", "-A"), ("-l walltime=99:00:00", "-l walltime"), ("-l select=9", "-l select")],
)
def test_options_a_field_sets_are_refused_in_raw_directives(directive: str, option: str) -> None:
    fields = {"-A": "Account", "-l walltime": "Wall Time", "-l select": "Nodes"}
    problem = PbsAdapter.directive_problem(directive, set_by_fields=fields)
    assert problem is not None and option in problem


def test_commands_on_a_node_go_to_the_node_the_scheduler_reports_quoted_once() -> None:
    runner = FakeRunner().on("qstat", ok(data("pbs_qstat_jobs.json"))).on("ssh", ok("x\n"))
    PbsAdapter(runner).run_in_job("1003.pbs01", ["echo", "$(id); a'b"])
    argv = runner.calls[-1][0]
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "cn017"]
    assert argv[4:] == ["--", "echo '$(id); a'\"'\"'b'"]


def test_default_fields_render_as_valid_directives() -> None:
    fields = {f.name: f for f in PbsAdapter(FakeRunner()).default_fields()}
    assert list(fields) == ["walltime", "numNodes", "account", "directives"]
    for template in fields.values():
        if template.directive:
            value = template.default or "x1"
            assert re.fullmatch(template.pattern, value)
            directive = template.directive.replace("{value}", value)
            assert PbsAdapter.directive_problem(directive, set_by_fields={}) is None

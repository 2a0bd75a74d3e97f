"""SlurmAdapter against recorded real Slurm 22.05 output and hand-written edge cases."""

from __future__ import annotations

import logging
import re
import subprocess

import pytest

from schedulers.base import JobSpec, Phase, QueryFailed, SchedulerError
from schedulers.slurm import (
    STATES,
    WALLTIME_PATTERN,
    SlurmAdapter,
    exit_code_from_status,
    first_host,
    parse_sinfo,
    parse_squeue,
)
from tests.schedulers.conftest import FakeRunner, data, failed, ok

# squeue(1) "JOB STATE CODES", Slurm 22.05-24.x.
DOCUMENTED_STATES = [
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE", "FAILED",
    "NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD",
    "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED", "RESIZING", "REVOKED", "SIGNALING",
    "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
]  # fmt: skip
FAILURES = {"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
NORMAL_ENDS = {"COMPLETED", "CANCELLED", "TIMEOUT", "PREEMPTED", "REVOKED"}
QUEUED = {
    "PENDING", "CONFIGURING", "SUSPENDED", "STOPPED", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
}  # fmt: skip
RUNNING = {"RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT"}


def line(job_id: str, state: str, node: str = "n1", exit_status: str = "0") -> str:
    return f"{job_id}|{state}|{node}|None|{exit_status}|job-{job_id}\n"


# -- states -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", DOCUMENTED_STATES)
def test_every_documented_state_is_mapped_explicitly(state: str) -> None:
    phase, failed_ = STATES[state]
    if state in FAILURES:
        assert (phase, failed_) == (Phase.ENDED, True)
    elif state in NORMAL_ENDS:
        assert (phase, failed_) == (Phase.ENDED, False)
    elif state in QUEUED:
        assert (phase, failed_) == (Phase.QUEUED, False)
    else:
        assert state in RUNNING
        assert (phase, failed_) == (Phase.RUNNING, False)


@pytest.mark.parametrize("state", DOCUMENTED_STATES)
def test_every_documented_state_parses_from_squeue(state: str) -> None:
    info = parse_squeue(line("7", state, exit_status="768"))["7"]
    assert (info.state, info.phase, info.failed) == (state, *STATES[state])
    # An exit code belongs to ended jobs only.
    assert info.exit_code == ("3:0" if info.phase is Phase.ENDED else "")


def test_unknown_state_is_logged_and_kept_live(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        jobs = parse_squeue(line("1", "QUANTUM_LEAP", node="") + line("2", "NEW_STATE", node="n4"))
    assert jobs["1"].phase is Phase.QUEUED
    assert jobs["2"].phase is Phase.RUNNING
    assert not any(job.phase is Phase.ENDED for job in jobs.values())
    assert "QUANTUM_LEAP" in caplog.text


# -- recorded squeue --------------------------------------------------------------------------


def test_recorded_squeue_output_of_every_kind_of_job() -> None:
    jobs = parse_squeue(data("squeue_states.txt"))
    summary = {
        info.name: (info.phase, info.state, info.exit_code, info.failed, info.node)
        for info in jobs.values()
    }
    assert summary == {
        "rec-running": (Phase.RUNNING, "RUNNING", "", False, "vm"),
        "rec-held": (Phase.QUEUED, "PENDING", "", False, ""),
        "rec-completed": (Phase.ENDED, "COMPLETED", "0:0", False, "vm"),
        "rec-failed": (Phase.ENDED, "FAILED", "3:0", True, "vm"),
        "rec-cancel": (Phase.ENDED, "CANCELLED", "0:15", False, "vm"),
        "rec-timeout": (Phase.ENDED, "TIMEOUT", "0:15", False, "vm"),
        "rec-signal": (Phase.ENDED, "FAILED", "0:9", True, "vm"),
    }
    assert jobs["71"].reason == "JobHeldUser"
    assert jobs["22"].reason == ""


def test_query_lists_known_ids_and_leaves_out_unknown_ones() -> None:
    # Recorded: squeue -j with 7 known ids and one unknown exits 0 and skips the unknown one.
    runner = FakeRunner().on("squeue", ok(data("squeue_states.txt")))
    result = SlurmAdapter(runner).query(["22", "71", "99999998"])
    assert set(result.jobs) == {"22", "71"}
    assert result.get("99999998") is None


def test_query_of_a_single_unknown_id_is_a_successful_empty_answer() -> None:
    # Recorded: with exactly one unknown id, squeue exits 1 "Invalid job id specified".
    runner = FakeRunner().on("squeue", failed(data("squeue_single_unknown.stderr")))
    assert SlurmAdapter(runner).query(["99999998"]).jobs == {}


def test_invalid_job_id_message_for_several_ids_is_not_trusted() -> None:
    runner = FakeRunner().on("squeue", failed(data("squeue_single_unknown.stderr")))
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).query(["1", "2"])


@pytest.mark.parametrize(
    "result",
    [
        failed("slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"),
        ok(stderr="slurm_load_jobs error: Socket timed out on send/recv operation\n"),
        ok(line("5", "RUNNING"), stderr="squeue: error: Invalid user: nobody\n"),
        failed("", exit_status=255),
        failed("slurm_load_jobs error: Invalid job id specified\nanother line\n"),
    ],
    ids=["controller-down", "error-with-exit-0", "error-beside-output", "bare-exit", "extra-line"],
)
def test_failed_or_doubtful_squeue_raises_query_failed(result: object) -> None:
    runner = FakeRunner().on("squeue", result)  # type: ignore[arg-type]
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).query(["5"])


@pytest.mark.parametrize(
    "stdout",
    [
        "5|RUNNING|n1|None|0\n",  # a field short
        "five|RUNNING|n1|None|0|x\n",  # id not a number
        "5|running|n1|None|0|x\n",  # not a state word
        "5|RUNNING|n1|None|zero|x\n",  # exit status not a number
        "garbage\n",
    ],
)
def test_unparseable_squeue_line_fails_the_whole_query(stdout: str) -> None:
    runner = FakeRunner().on("squeue", ok(line("4", "RUNNING") + stdout))
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).query(["4", "5"])


def test_empty_output_means_none_of_the_jobs_is_listed() -> None:
    runner = FakeRunner().on("squeue", ok(""))
    assert SlurmAdapter(runner).query(["4", "5"]).jobs == {}


def test_a_job_name_may_contain_the_separator() -> None:
    jobs = parse_squeue("9|RUNNING|n1|None|0|odd|name\n")
    assert jobs["9"].name == "odd|name"


def test_query_sends_all_ids_in_one_squeue_with_final_states_included() -> None:
    runner = FakeRunner().on("squeue", ok(""))
    ids = [str(n) for n in range(1000, 1200)]
    SlurmAdapter(runner).query(ids)
    assert len(runner.calls) == 1
    argv = runner.calls[0][0]
    assert "--states=all" in argv
    jobs_arg = next(a for a in argv if a.startswith("--jobs="))
    assert sorted(jobs_arg.removeprefix("--jobs=").split(",")) == sorted(ids)


def test_huge_queries_list_the_accounts_jobs_in_one_command_and_keep_only_the_asked() -> None:
    listing = "".join(f"{n}|PENDING||Priority|0|pw-worker-x{n}\n" for n in range(1, 1300))
    runner = FakeRunner().on("squeue", ok(listing + "99999|RUNNING|n1|None|0|mine-too\n"))
    asked = [str(n) for n in range(1, 1202)]
    jobs = SlurmAdapter(runner).query(asked).jobs
    assert len(runner.calls) == 1
    argv = runner.calls[0][0]
    assert "--me" in argv and "--states=all" in argv
    assert not any(a.startswith("--jobs=") for a in argv)
    assert sorted(jobs, key=int) == asked


def test_query_refuses_ids_that_could_be_options() -> None:
    with pytest.raises(ValueError):
        SlurmAdapter(FakeRunner()).query(["12", "--me"])


def test_query_of_nothing_runs_nothing() -> None:
    runner = FakeRunner()
    assert SlurmAdapter(runner).query([]).jobs == {}
    assert runner.calls == []


# -- helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("vm", "vm"),
        ("n[03-05,9],m1", "n03"),
        ("gpu[7]", "gpu7"),
        ("a,b", "a"),
        ("", ""),
        ("(null)", ""),
    ],
)
def test_first_host_of_a_hostlist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(("raw", "shown"), [("0", "0:0"), ("768", "3:0"), ("15", "0:15")])
def test_wait_status_is_shown_as_code_and_signal(raw: str, shown: str) -> None:
    assert exit_code_from_status(raw) == shown


# -- submit -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [("4242\n", "4242"), ("4242;cluster2\n", "4242"), ("note: sent\n77\n", "77")],
)
def test_submit_returns_the_parsable_job_id(stdout: str, job_id: str) -> None:
    runner = FakeRunner().on("sbatch", ok(stdout))
    adapter = SlurmAdapter(runner)
    assert adapter.submit(spec()) == job_id
    argv, stdin = runner.calls[0]
    # Name, output, error and partition on the command line win over anything in the script.
    assert argv == [
        "sbatch",
        "--parsable",
        "--job-name=pw-worker-w2abc",
        "--output=/dev/null",
        "--error=/dev/null",
        "--partition=debug",
    ]
    assert stdin == adapter.render_script(spec())


def test_refused_submit_raises_with_sbatch_message() -> None:
    message = "sbatch: error: invalid partition specified: nope\n"
    runner = FakeRunner().on("sbatch", failed(message))
    with pytest.raises(SchedulerError, match="invalid partition specified"):
        SlurmAdapter(runner).submit(spec())


def test_submit_with_unreadable_output_raises() -> None:
    runner = FakeRunner().on("sbatch", ok("Submitted batch job 12\n"))
    with pytest.raises(SchedulerError):
        SlurmAdapter(runner).submit(spec())


# -- final state ------------------------------------------------------------------------------


def test_final_state_falls_back_to_scontrol_when_accounting_is_disabled() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", ok(data("scontrol_jobs.txt")))
    )
    info = SlurmAdapter(runner).final_state("175")
    assert info is not None
    assert (info.phase, info.state, info.exit_code, info.failed) == (
        Phase.ENDED,
        "FAILED",
        "3:0",
        True,
    )
    assert (info.name, info.node, info.reason) == ("rec-failed", "vm", "NonZeroExitCode")
    assert runner.programs == ["sacct", "scontrol"]


def test_final_state_of_a_timed_out_job_from_scontrol() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", ok(data("scontrol_jobs.txt")))
    )
    info = SlurmAdapter(runner).final_state("213")
    assert info is not None
    assert (info.state, info.exit_code, info.failed) == ("TIMEOUT", "0:15", False)


def test_final_state_uses_accounting_when_it_works() -> None:
    sacct = (
        "31|OUT_OF_MEMORY|0:125|n7|big\n"
        "31.batch|OUT_OF_MEMORY|0:125|n7|batch\n"
        "31.extern|COMPLETED|0:0|n7|extern\n"
    )
    runner = FakeRunner().on("sacct", ok(sacct))
    info = SlurmAdapter(runner).final_state("31")
    assert info is not None
    assert (info.state, info.exit_code, info.failed, info.node) == (
        "OUT_OF_MEMORY",
        "0:125",
        True,
        "n7",
    )
    assert runner.programs == ["sacct"]


def test_final_state_reads_cancelled_by_uid_as_cancelled() -> None:
    runner = FakeRunner().on("sacct", ok("8|CANCELLED by 1001|0:15|n1|w\n"))
    info = SlurmAdapter(runner).final_state("8")
    assert info is not None and info.state == "CANCELLED" and not info.failed


def test_final_state_is_none_when_nobody_remembers_the_job() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", failed(data("scontrol_unknown.stderr")))
    )
    assert SlurmAdapter(runner).final_state("99999998") is None


def test_final_state_of_a_task_of_a_live_array_scontrol_no_longer_has_is_none() -> None:
    # A task cancelled while pending leaves no record; scontrol says so on stdout.
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", failed("", stdout="Job 12_3 not found\n"))
    )
    assert SlurmAdapter(runner).final_state("12_3") is None
    # Anything else scontrol says is no answer, for a task or a job.
    for job_id, said in [("12_3", "Job 12_4 not found\n"), ("12", "Job 12 not found\n")]:
        runner = (
            FakeRunner()
            .on("sacct", failed(data("sacct_disabled.stderr")))
            .on("scontrol", failed("", stdout=said))
        )
        with pytest.raises(QueryFailed, match="scontrol"):
            SlurmAdapter(runner).final_state(job_id)


def test_final_state_of_a_task_reads_its_own_scontrol_line() -> None:
    line = (
        "JobId=17 ArrayJobId=12 ArrayTaskId=3 JobName=arr UserId=u(1) GroupId=u(1) "
        "JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 NodeList=n1\n"
    )
    runner = (
        FakeRunner().on("sacct", failed(data("sacct_disabled.stderr"))).on("scontrol", ok(line))
    )
    info = SlurmAdapter(runner).final_state("12_3")
    assert info is not None and (info.state, info.node, info.exit_code) == ("TIMEOUT", "n1", "0:15")
    assert SlurmAdapter(runner).final_state("12_4") is None


def test_final_state_does_not_guess_when_accounting_is_down() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed("sacct: error: Problem talking to the database: Connection refused\n"))
        .on("scontrol", failed(data("scontrol_unknown.stderr")))
    )
    with pytest.raises(QueryFailed, match="sacct"):
        SlurmAdapter(runner).final_state("12")


def test_final_state_of_a_job_scontrol_still_runs_raises() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", ok(data("scontrol_jobs.txt")))
    )
    with pytest.raises(QueryFailed, match="RUNNING"):
        SlurmAdapter(runner).final_state("22")


def test_final_state_when_the_controller_is_down_raises() -> None:
    runner = (
        FakeRunner()
        .on("sacct", failed(data("sacct_disabled.stderr")))
        .on("scontrol", failed("slurm_load_jobs error: Unable to contact slurm controller\n"))
    )
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).final_state("22")


# -- cancel, find, list -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        ok(),
        failed("scancel: error: Kill job error on job id 5: Invalid job id specified\n"),
        failed(
            "scancel: error: Kill job error on job id 5: Job/step already completing or completed\n"
        ),
    ],
)
def test_cancel_of_a_live_or_gone_job_succeeds(result: object) -> None:
    runner = FakeRunner().on("scancel", result)  # type: ignore[arg-type]
    SlurmAdapter(runner).cancel("5")
    assert runner.calls[0][0] == ["scancel", "5"]


def test_cancel_that_the_controller_refuses_raises() -> None:
    runner = FakeRunner().on(
        "scancel", failed("scancel: error: Kill job error on job id 5: Access/permission denied\n")
    )
    with pytest.raises(SchedulerError, match="permission denied"):
        SlurmAdapter(runner).cancel("5")


def test_find_job_returns_the_live_job_with_that_name_only() -> None:
    stdout = (
        "10|CANCELLED|n1|None|15|pw-worker-a\n"
        "11|PENDING||Priority|0|pw-worker-a\n"
        "12|RUNNING|n1|None|0|pw-worker-ab\n"
    )
    runner = FakeRunner().on("squeue", ok(stdout))
    assert SlurmAdapter(runner).find_job("pw-worker-a") == "11"
    argv = runner.calls[0][0]
    # The account's own jobs only: a neighbour can name a job like ours.
    assert "--name=pw-worker-a" in argv and "--me" in argv


def test_find_job_without_a_live_job_is_none_and_failure_raises() -> None:
    runner = FakeRunner().on("squeue", ok("10|COMPLETED|n1|None|0|w\n"))
    assert SlurmAdapter(runner).find_job("w") is None
    runner = FakeRunner().on("squeue", failed("slurm_load_jobs error: Socket timed out\n"))
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).find_job("w")


def test_list_platform_jobs_keeps_live_jobs_with_the_prefix() -> None:
    stdout = (
        "1|RUNNING|n1|None|0|pw-worker-a\n"
        "2|PENDING||Priority|0|pw-worker-b\n"
        "3|RUNNING|n1|None|0|my-own-job\n"
        "4|COMPLETING|n1|None|0|pw-worker-c\n"
    )
    runner = FakeRunner().on("squeue", ok(stdout))
    jobs = SlurmAdapter(runner).list_platform_jobs("pw-worker-")
    assert jobs == {"1": "pw-worker-a", "2": "pw-worker-b", "4": "pw-worker-c"}
    assert runner.calls[0][0][:3] == ["squeue", "--noheader", "--me"]


# -- partitions -------------------------------------------------------------------------------


def test_recorded_sinfo_output() -> None:
    partitions = {p.name: p for p in parse_sinfo(data("sinfo.txt"))}
    assert partitions["debug"].is_default and not partitions["short"].is_default
    assert (partitions["debug"].nodes_total, partitions["debug"].nodes_available) == (1, 1)
    assert partitions["short"].max_time == "1:00:00"


def test_sinfo_counts_only_nodes_that_can_start_a_job_now() -> None:
    stdout = (
        "batch*|up|2-00:00:00|10|idle\n"
        "batch*|up|2-00:00:00|5|mixed\n"
        "batch*|up|2-00:00:00|20|allocated\n"
        "batch*|up|2-00:00:00|2|drained\n"
        "batch*|up|2-00:00:00|1|idle*\n"
        "batch*|up|2-00:00:00|3|idle~\n"
        "batch*|up|2-00:00:00|1|down*\n"
        "gpu|up|1-00:00:00|4|idle\n"
        "closed|down|infinite|6|idle\n"
    )
    partitions = {p.name: p for p in parse_sinfo(stdout)}
    assert (partitions["batch"].nodes_total, partitions["batch"].nodes_available) == (42, 18)
    assert partitions["batch"].is_default and partitions["batch"].max_time == "2-00:00:00"
    assert (partitions["gpu"].nodes_total, partitions["gpu"].nodes_available) == (4, 4)
    assert (partitions["closed"].nodes_total, partitions["closed"].nodes_available) == (6, 0)


def test_sinfo_failure_raises() -> None:
    runner = FakeRunner().on("sinfo", failed("sinfo: error: Unable to contact slurm controller\n"))
    with pytest.raises(QueryFailed):
        SlurmAdapter(runner).partitions()
    with pytest.raises(QueryFailed):
        parse_sinfo("debug*|up|infinite|one|idle\n")


# -- scripts and fields -----------------------------------------------------------------------


def spec(**overrides: object) -> JobSpec:
    values: dict[str, object] = {
        "name": "pw-worker-w2abc",
        "partition": "debug",
        "directives": ["--time=04:00:00", "--account=proj1"],
        "environment": {"ACTIVATE_URL": "http://127.0.0.1:8000"},
        "command": "exec sleep 10",
    }
    values.update(overrides)
    return JobSpec(**values)  # type: ignore[arg-type]


def test_rendered_script_has_platform_header_then_user_directives() -> None:
    script = SlurmAdapter(FakeRunner()).render_script(spec())
    assert script.splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=pw-worker-w2abc",
        "#SBATCH --partition=debug",
        "#SBATCH --output=/dev/null",
        "#SBATCH --error=/dev/null",
        "#SBATCH --nodes=1",
        "#SBATCH --time=04:00:00",
        "#SBATCH --account=proj1",
        "export ACTIVATE_URL=http://127.0.0.1:8000",
        'export ACTIVATE_JOB_ID="${SLURM_JOB_ID:-}"',
        "export ACTIVATE_JOB_VARIABLE=SLURM_JOB_ID",
        "exec sleep 10",
    ]


def test_user_node_count_replaces_the_default() -> None:
    script = SlurmAdapter(FakeRunner()).render_script(spec(directives=["--nodes=4"], partition=""))
    assert "--nodes=1" not in script
    assert "#SBATCH --nodes=4" in script
    assert "--partition" not in script


HOSTILE = 'it\'s "quoted" $(touch /tmp/pwned) `id` ; rm -rf ~ \n second line \\ end'


def test_hostile_environment_values_arrive_verbatim_in_bash() -> None:
    script = SlurmAdapter(FakeRunner()).render_script(
        spec(environment={"A": HOSTILE, "B": "plain"}, command='printf "%s" "$A"')
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout == HOSTILE


@pytest.mark.parametrize(
    "directives",
    [
        ["--time=1\nrm -rf ~"],
        ["--mem=4G; rm -rf ~"],
        ["--comment=$(id)"],
        ["--output=/home/other/steal"],
        ["--job-name=other"],
        ["--wrap=id"],
        ["--array=1-100"],
        ["--wait"],
        ["--partition=vip"],
        ["--outp=/tmp/x"],
        ["--job-nam=other"],
        ["--arr=0-3"],
        ["--parti=vip"],
        ["--chdir=/tmp"],
        ["--export=ALL"],
        ["-N 2"],
        ["--mem=4G", "--export=ALL --uid=0"],
    ],
)
def test_directives_that_could_inject_or_untrack_are_refused(directives: list[str]) -> None:
    with pytest.raises(SchedulerError):
        SlurmAdapter(FakeRunner()).render_script(spec(directives=directives))


@pytest.mark.parametrize(
    "directive",
    ["--mem=4G", "--gres=gpu:2", "--constraint=a100", "--exclusive", "--nodelist=n[1-3]"],
)
def test_ordinary_directives_are_accepted(directive: str) -> None:
    assert SlurmAdapter.directive_problem(directive, set_by_fields={}) is None
    assert f"#SBATCH {directive}\n" in SlurmAdapter(FakeRunner()).render_script(
        spec(directives=[directive])
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "x y"},
        {"name": "x\n#SBATCH --wrap=id"},
        {"partition": "debug;id"},
        {"environment": {"A;id": "1"}},
        {"environment": {"A": "nul\x00byte"}},
    ],
)
def test_unsafe_names_partitions_and_variables_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(SchedulerError):
        SlurmAdapter(FakeRunner()).render_script(spec(**overrides))


@pytest.mark.parametrize(
    "value", ["30", "30:00", "01:00:00", "2-00", "2-12:30", "7-00:00:00", "100:00:00"]
)
def test_walltime_pattern_accepts_every_slurm_time_format(value: str) -> None:
    assert re.fullmatch(WALLTIME_PATTERN, value)


@pytest.mark.parametrize("value", ["", "1h", "01:00:00;id", "-1", "1:2:3:4", "1-2-3", "UNLIMITED"])
def test_walltime_pattern_refuses_anything_else(value: str) -> None:
    assert not re.fullmatch(WALLTIME_PATTERN, value)


def test_default_fields_render_as_valid_directives() -> None:
    adapter = SlurmAdapter(FakeRunner())
    fields = {f.name: f for f in adapter.default_fields()}
    assert list(fields) == ["walltime", "numNodes", "account", "qos", "directives"]
    assert fields["walltime"].default == "01:00:00"
    assert fields["numNodes"].default == "1"
    assert fields["directives"].kind == "directives"
    for template in fields.values():
        if template.directive:
            value = template.default or "x1"
            assert re.fullmatch(template.pattern, value)
            directive = template.directive.replace("{value}", value)
            assert SlurmAdapter.directive_problem(directive, set_by_fields={}) is None


@pytest.mark.parametrize(
    ("directive", "option"),
    [("--account=other", "account"), ("--time=99:00:00", "time"), ("--nodes=9", "nodes")],
)
def test_options_a_field_sets_are_refused_in_raw_directives(directive: str, option: str) -> None:
    problem = SlurmAdapter.directive_problem(
        directive,
        set_by_fields={"account": "Account", "time": "Wall Time", "nodes": "Nodes", "qos": "QoS"},
    )
    assert problem is not None and option in problem


@pytest.mark.parametrize(
    ("listed", "cancelled"),
    [("12", "12"), ("12_3", "12_3"), ("12_[0-2]", "12"), ("12+0", "12")],
)
def test_cancel_takes_every_form_of_job_id_squeue_prints(listed: str, cancelled: str) -> None:
    runner = FakeRunner().on("scancel", ok(""))
    SlurmAdapter(runner).cancel(listed)
    assert runner.calls[0][0] == ["scancel", cancelled]

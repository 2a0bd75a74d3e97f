"""A bulk of Slurm jobs as job arrays, from what the command sends and the loop does with it:
each task's environment in a private file of its own, one sbatch an array, a refused array sent
one job a sbatch."""

from __future__ import annotations

import shlex
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from schedulers import slurm
from schedulers.base import JobSpec, SchedulerError, SchedulerUnavailable, task_key
from schedulers.slurm import FILE, SUBMIT_COMMAND, SUBMIT_MARKER, SlurmAdapter, parse_submit_loop
from tests.schedulers.conftest import LOGIN_HOSTS, FakeRunner, ok, run_submit_loop

SECRET = "s3cr3t-'$(id)'"


@pytest.fixture(autouse=True)
def one_array_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays sent one after the other, so scripted answers go to them in order."""
    monkeypatch.setattr(slurm, "ARRAY_PARALLEL", 1)
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 1)


def spec(name: str, **overrides: object) -> JobSpec:
    values: dict[str, object] = {
        "name": name,
        "partition": "debug",
        "directives": ["--time=10"],
        "environment": {"ACTIVATE_AGENT_KEY": f"{SECRET}-{name}"},
        "command": "exec agent",
    }
    values.update(overrides)
    return JobSpec(**values)  # type: ignore[arg-type]


def records(stdin: str | None) -> list[tuple[list[str], str]]:
    """The (header words, data) records of a command's input."""
    data, found = (stdin or "").encode(), []
    while data:
        head, _, data = data.partition(b"\n")
        words = head.decode().split()
        size = int(words[2])
        found.append((words, data[:size].decode()))
        data = data[size:]
    return found


def answered(*records: tuple[str, int]) -> str:
    return "".join(f"{output}\n{SUBMIT_MARKER} {status}\n" for output, status in records)


def test_a_bulk_is_one_command_its_secrets_in_files_and_each_job_a_task() -> None:
    # Given five jobs alike but for their keys
    runner = FakeRunner().on("sh", ok(answered(("4242", 0))))
    specs = [spec(f"w{n}") for n in range(5)]

    outcomes = SlurmAdapter(runner).submit_many(specs)

    # Then one command wrote five private files and made one array of tasks 0-4
    assert outcomes == [f"4242_{n}" for n in range(5)]
    [(_, stdin)] = runner.calls
    sent = records(stdin)
    files, [(header, script)] = sent[:5], sent[5:]
    array = header[0]
    assert array.startswith("w0-") and header[1:2] == ["debug"] and header[3] == "0-4"
    assert [words[:2] for words, _ in files] == [[FILE, f"{array}.{n}.env"] for n in range(5)]
    assert [shlex.quote(f"{SECRET}-w{n}") in text for n, (_, text) in enumerate(files)] == [
        True
    ] * 5
    # and the one script names the array, reads its task's file, and holds no key
    assert f"--job-name={array}" in script and "--time=10" in script
    assert f"{array}.${{SLURM_ARRAY_TASK_ID}}.env" in script and SECRET not in script


def test_each_array_is_keyed_just_before_its_command_with_its_tasks_keys() -> None:
    # Given seven jobs dealt in arrays of at most three, and a prepare that keys them
    runner = FakeRunner().on("sh", ok(answered(("7", 0))))
    prepared: list[list[str]] = []

    def prepare(specs: list[JobSpec]) -> list[JobSpec]:
        prepared.append([s.key for s in specs])
        return [replace(s, environment={"ACTIVATE_AGENT_KEY": "k-" + s.name}) for s in specs]

    adapter = SlurmAdapter(runner)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slurm, "ARRAY_TASKS", 3)
        outcomes = adapter.submit_many([spec(f"w{n}") for n in range(7)], prepare=prepare)

    # Then each of the three arrays was prepared with the keys its tasks will be found by
    assert [len(keys) for keys in prepared] == [2, 2, 3]
    arrays = [keys[0].split("[")[0] for keys in prepared]
    assert len(set(arrays)) == 3
    assert prepared[0] == [task_key(arrays[0], 0), task_key(arrays[0], 1)]
    assert outcomes == ["7_0", "7_1", "7_0", "7_1", "7_0", "7_1", "7_2"]
    assert all(
        f"k-w{n}" in str(stdin) for n, (_, stdin) in zip((0, 2, 4), runner.calls, strict=True)
    )


def test_jobs_with_other_directives_go_in_arrays_of_their_own_in_order() -> None:
    runner = FakeRunner().on("sh", ok(answered(("10", 0))), ok(answered(("11", 0))))
    specs = [spec("a"), spec("b", directives=["--time=20"]), spec("c"), spec("d")]

    outcomes = SlurmAdapter(runner).submit_many(specs)

    headers = [records(stdin)[-1][0] for _, stdin in runner.calls]
    assert [h[3] for h in headers] == ["0-2", "0-0"]
    assert outcomes == ["10_0", "11_0", "10_1", "10_2"]


def test_a_refused_array_goes_one_job_a_sbatch_keyed_again_each_with_its_own_outcome() -> None:
    # Given a site whose sbatch refuses arrays (MaxArraySize lower than the array)
    runner = FakeRunner().on(
        "sh",
        ok(answered(("sbatch: error: Batch job submission failed: Invalid job array", 1))),
        ok(answered(("21", 0), ("sbatch: error: invalid partition specified", 1), ("23", 0))),
    )
    prepared: list[list[str]] = []

    def prepare(specs: list[JobSpec]) -> list[JobSpec]:
        prepared.append([s.key for s in specs])
        return specs

    outcomes = SlurmAdapter(runner).submit_many([spec(f"w{n}") for n in range(3)], prepare=prepare)

    # Then the jobs were keyed again under their own names and sent one sbatch each
    assert prepared[1] == ["w0", "w1", "w2"] and prepared[0][0].startswith("w0-")
    assert outcomes[0] == "21" and outcomes[2] == "23"
    assert isinstance(outcomes[1], SchedulerError) and "partition" in str(outcomes[1])
    assert [len(records(stdin)) for _, stdin in runner.calls] == [4, 0, 3]
    # and the refused array's files, each a key, were removed before they went
    array = prepared[0][0].split("[")[0]
    assert runner.calls[1][0] == ["sh", "-c", f'rm -f "$HOME/.activate/jobs/{array}".*.env']


def test_an_array_without_an_answer_leaves_every_task_unknown() -> None:
    for answer in ["", answered(("Socket timed out on send/recv operation", 1))]:
        runner = FakeRunner().on("sh", ok(answer))
        outcomes = SlurmAdapter(runner).submit_many([spec("a"), spec("b")])
        assert len(outcomes) == 2
        assert all(isinstance(o, SchedulerUnavailable) for o in outcomes), outcomes


FAKE_SBATCH = """#!/bin/sh
n=$(ls "$KEPT" | wc -l)
echo "$@" > "$KEPT/$n"
cat >> "$KEPT/$n"
echo "$((100 + n))"
"""


@pytest.mark.parametrize("login_host", LOGIN_HOSTS)
def test_the_loop_writes_each_tasks_file_private_and_never_outside_the_jobs_folder(
    tmp_path: Path, login_host: str
) -> None:
    # Given two task files, an array, then a file whose name would leave the folder, and a job
    def record(name: str, second: str, data: str, *more: str) -> str:
        return " ".join([name, second, str(len(data.encode())), *more]) + "\n" + data

    stdin = (
        record(FILE, "arr.0.env", "KEY=one\n")
        + record(FILE, "arr.1.env", "KEY=two\n")
        + record("arr", "debug", "#!/bin/sh\n", "0-1")
        + record(FILE, "../escape.env", "KEY=three\n")
        + record("later", "-", "#!/bin/sh\n")
    )
    tools = ("ls", "wc", "cat", "mkdir")
    output, kept = run_submit_loop(
        SUBMIT_COMMAND,
        stdin.encode(),
        tmp_path,
        login_host,
        fakes={"sbatch": FAKE_SBATCH},
        tools=tools,
    )

    # Then the files are the account's alone, the array went with --array, and the job after
    # the refused file was never submitted
    folder = tmp_path / "home" / ".activate" / "jobs"
    assert (folder / "arr.0.env").read_text() == "KEY=one\n"
    assert (folder / "arr.1.env").read_text() == "KEY=two\n"
    assert stat.S_IMODE((folder / "arr.1.env").stat().st_mode) == 0o600
    assert not (tmp_path / "home" / ".activate" / "escape.env").exists()
    assert sorted(p.name for p in kept.iterdir()) == ["0"]
    assert "--job-name=arr" in (kept / "0").read_text()
    assert "--array=0-1" in (kept / "0").read_text()
    outcomes = parse_submit_loop(output, SlurmAdapter(FakeRunner()))
    assert outcomes[0] == "100"
    assert isinstance(outcomes[1], SchedulerError) and len(outcomes) == 2

"""Batched sbatch, from what the remote loop prints: one outcome per script, in order, and a
batch cut short leaves the rest unknown (never refused, never made)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from schedulers import slurm
from schedulers.base import CommandResult, JobSpec, SchedulerError, SchedulerUnavailable
from schedulers.slurm import (
    SUBMIT_COMMAND,
    SUBMIT_MARKER,
    SUBMIT_PROGRAM,
    SlurmAdapter,
    parse_submit_loop,
)
from tests.schedulers.conftest import (
    LOGIN_HOSTS,
    OLD_PYTHON,
    FakeRunner,
    ok,
    run_submit_loop,
)


@pytest.fixture(autouse=True)
def one_command_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every script of a test in one command, so one scripted answer covers the batch."""
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 1)


def spec(name: str, **overrides: object) -> JobSpec:
    values: dict[str, object] = {"name": name, "partition": "debug", "directives": []}
    values.update(overrides)
    return JobSpec(**values)  # type: ignore[arg-type]


def sent(stdin: str | None) -> list[tuple[str, str, str]]:
    """The (name, partition, script) records of a submit loop's input."""
    data, records = (stdin or "").encode(), []
    while data:
        head, _, data = data.partition(b"\n")
        name, partition, size = head.decode().split()
        records.append((name, partition, data[: int(size)].decode()))
        data = data[int(size) :]
    return records


def answered(*records: tuple[str, int]) -> str:
    return "".join(f"{output}\n{SUBMIT_MARKER} {status}\n" for output, status in records)


def test_each_script_gets_its_own_outcome_in_order() -> None:
    runner = FakeRunner().on(
        "sh",
        ok(
            answered(
                ("101", 0),
                ("sbatch: error: invalid partition specified: nope", 1),
                ("sbatch: warning: something\n103;cluster", 0),
            )
        ),
    )
    outcomes = SlurmAdapter(runner).submit_each([spec("a"), spec("b"), spec("c")])

    assert outcomes[0] == "101" and outcomes[2] == "103"
    assert isinstance(outcomes[1], SchedulerError)
    assert not isinstance(outcomes[1], SchedulerUnavailable)
    assert "invalid partition" in str(outcomes[1])
    [(argv, stdin)] = runner.calls
    assert argv[:2] == ["sh", "-c"]
    records = sent(stdin)
    assert [r[:2] for r in records] == [("a", "debug"), ("b", "debug"), ("c", "debug")]
    assert records[0][2].startswith("#!/bin/bash\n") and "--job-name=a" in records[0][2]


def test_a_batch_cut_short_leaves_the_rest_unknown() -> None:
    runner = FakeRunner().on("sh", ok(answered(("201", 0)) + "202\n"))
    outcomes = SlurmAdapter(runner).submit_each([spec("a"), spec("b"), spec("c")])

    assert outcomes[0] == "201"
    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes[1:])


def test_an_unreadable_answer_is_unknown_and_a_controller_outage_is_unavailable() -> None:
    runner = FakeRunner().on(
        "sh",
        ok(answered(("Submitted batch job", 0), ("Unable to contact slurm controller", 1))),
    )
    outcomes = SlurmAdapter(runner).submit_each([spec("a"), spec("b")])

    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes)


def test_a_spec_refused_before_sending_does_not_stop_the_others() -> None:
    runner = FakeRunner().on("sh", ok(answered(("301", 0), ("302", 0))))
    outcomes = SlurmAdapter(runner).submit_each(
        [spec("a"), spec("bad name\nsbatch evil"), spec("c")]
    )

    assert outcomes[0] == "301" and outcomes[2] == "302"
    assert isinstance(outcomes[1], SchedulerError)
    [(_, stdin)] = runner.calls
    assert [name for name, _, _ in sent(stdin)] == ["a", "c"]


def test_lookups_by_name_are_one_squeue_for_many_names() -> None:
    listed = "\n".join(
        [
            "11|PENDING|(null)|BeginTime|0|a",
            "12|COMPLETED|n1|None|0|b",
            "13|RUNNING|n1|None|0|c",
        ]
    )
    runner = FakeRunner().on("squeue", ok(listed))

    assert SlurmAdapter(runner).find_jobs(["a", "b", "c", "d"]) == {"a": "11", "c": "13"}
    [(argv, _)] = runner.calls
    assert "--name=a,b,c,d" in argv and "--me" in argv


def test_a_large_batch_goes_in_a_few_commands_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 3)
    runner = FakeRunner().on("sh", ok(answered(*[("7", 0)] * 4)))

    outcomes = SlurmAdapter(runner).submit_each([spec(f"w{n}") for n in range(12)])

    assert len(runner.calls) == 3
    assert outcomes == ["7"] * 12


def test_a_batch_past_one_round_is_dealt_in_equal_shares_a_multiple_of_those_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 3 commands at once of at most 50 scripts, and 200 jobs: more than one round
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 3)
    monkeypatch.setattr(slurm, "SUBMIT_CHUNK", 50)
    runner = FakeRunner().on("sh", ok(answered(*[("7", 0)] * 50)))
    names = [f"w{n}" for n in range(200)]

    outcomes = SlurmAdapter(runner).submit_each([spec(name) for name in names])

    # Then two rounds of three commands of 33 or 34 scripts, none left to run alone, every
    # job sent once and in order
    shares = [[name for name, _, _ in sent(stdin)] for _, stdin in runner.calls]
    shares.sort(key=lambda share: names.index(share[0]))
    assert [len(share) for share in shares] == [33, 33, 34, 33, 33, 34]
    assert [name for share in shares for name in share] == names
    assert outcomes == ["7"] * 200


def test_each_command_is_prepared_just_before_it_starts_and_the_first_starts_before_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 3 commands at once for 9 jobs, a prepare step that gives each job its environment,
    # and that waits, for the last command's jobs, until a command has started
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 3)
    prepared: set[str] = set()
    started = threading.Event()
    unprepared_at_start: list[str] = []

    class Runner(FakeRunner):
        def run(self, argv: list[str], **kwargs: object) -> CommandResult:
            names = [name for name, _, _ in sent(kwargs.get("stdin"))]  # type: ignore[arg-type]
            unprepared_at_start.extend(name for name in names if name not in prepared)
            started.set()
            return super().run(argv, **kwargs)  # type: ignore[arg-type]

    def prepare(specs: list[JobSpec]) -> list[JobSpec]:
        if specs[0].name == "w6":
            assert started.wait(timeout=10), "no command started before the last was prepared"
        prepared.update(s.name for s in specs)
        return [replace(s, environment={"KEY": s.name}) for s in specs]

    runner = Runner().on("sh", ok(answered(*[("7", 0)] * 3)))

    # When they are submitted
    outcomes = SlurmAdapter(runner).submit_each([spec(f"w{n}") for n in range(9)], prepare=prepare)

    # Then each command sent only jobs already prepared, with what prepare gave them
    assert outcomes == ["7"] * 9
    assert unprepared_at_start == []
    scripts = {name: script for _, stdin in runner.calls for name, _, script in sent(stdin)}
    assert all(f"export KEY={name}" in script for name, script in scripts.items())
    assert sorted(scripts) == [f"w{n}" for n in range(9)]


def scripts_sent(stdin: str) -> dict[str, str]:
    """Each job's whole script as the loop puts it together: its own bytes, then the bytes of
    the "#shared" record before it, if any."""
    data, shared, scripts = stdin.encode(), b"", {}
    while data:
        head, _, data = data.partition(b"\n")
        words = head.decode().split()
        size = int(words[-1])
        if words[0] == "#shared":
            shared = data[:size]
        else:
            scripts[words[0]] = (data[:size] + shared).decode()
        data = data[size:]
    return scripts


def test_the_end_every_script_shares_goes_once_a_command_and_each_script_arrives_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 12 jobs, 3 commands at once, each job's script ending with the same 20 KB agent
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 3)
    agent = "exec python3 - <<'EOF'\n" + "print('agent')\n" * 1400 + "EOF"
    specs = [spec(f"w{n}", environment={"KEY": f"key-{n}"}, command=agent) for n in range(12)]
    runner = FakeRunner().on("sh", ok(answered(*[("7", 0)] * 4)))

    outcomes = SlurmAdapter(runner).submit_each(specs)

    # Then each command carries the agent once, and each script is whole once put together
    assert outcomes == ["7"] * 12
    assert len(runner.calls) == 3
    for _, stdin in runner.calls:
        assert stdin is not None and stdin.count("print('agent')") == 1400
    scripts = {name: s for _, stdin in runner.calls for name, s in scripts_sent(stdin).items()}
    adapter = SlurmAdapter(FakeRunner())
    assert scripts == {s.name: adapter.render_script(s) for s in specs}


@pytest.mark.parametrize("login_host", LOGIN_HOSTS)
def test_the_loop_ends_each_later_script_with_the_shared_bytes_and_never_uses_them_cut_short(
    tmp_path: Path, login_host: str
) -> None:
    # Given a shared end (multibyte, trailing newlines) and two scripts after it
    shared = "echo 'héllo $HOME `id`'\n" * 100 + "\n\n"
    own = ["#!/bin/bash\n#SBATCH --job-name=a\n", "#!/bin/bash\n"]
    stdin = f"#shared {len(shared.encode())}\n{shared}" + "".join(
        f"n{i} - {len(s.encode())}\n{s}" for i, s in enumerate(own)
    )

    output, received = run_loop(stdin.encode(), tmp_path, login_host)

    # Then sbatch got each script whole, its own bytes and then the shared ones
    assert received == [(s + shared).encode() for s in own]
    assert parse_submit_loop(output, SlurmAdapter(FakeRunner())) == ["100", "101"]
    # When the connection drops inside the shared bytes: nothing is submitted
    cut = stdin.encode()[: len(shared) // 2]
    output, received = run_loop(cut, tmp_path / "cut", login_host)
    assert received == []
    assert SUBMIT_MARKER not in output


FAKE_SBATCH = """#!/bin/sh
n=$(ls "$KEPT" | wc -l)
cat > "$KEPT/$n"
if grep -q REFUSE "$KEPT/$n"; then echo "sbatch: error: Batch job submission failed"; exit 1; fi
echo "$((100 + n))"
"""


def run_loop(stdin: bytes, tmp_path: Path, login_host: str) -> tuple[str, list[bytes]]:
    """SUBMIT_COMMAND with an sbatch on PATH that keeps each script it is given."""
    tools = ("ls", "wc", "cat", "grep")
    output, kept = run_submit_loop(
        SUBMIT_COMMAND, stdin, tmp_path, login_host, fakes={"sbatch": FAKE_SBATCH}, tools=tools
    )
    scripts = [(kept / str(n)).read_bytes() for n in range(len(list(kept.iterdir())))]
    return output, scripts


@pytest.mark.parametrize("login_host", LOGIN_HOSTS)
def test_scripts_reach_sbatch_byte_for_byte_and_one_cut_short_is_never_submitted(
    tmp_path: Path, login_host: str
) -> None:
    scripts = ["#!/bin/bash\necho 'héllo $HOME `id`'\n\n\n", "#!/bin/bash\ntrue", "#" * 20000]
    stdin = "".join(f"n{i} - {len(s.encode())}\n{s}" for i, s in enumerate(scripts)).encode()

    output, received = run_loop(stdin, tmp_path, login_host)

    assert received == [s.encode() for s in scripts]
    assert parse_submit_loop(output, SlurmAdapter(FakeRunner())) == ["100", "101", "102"]
    # The connection drops in the middle of the second script: only the first was submitted.
    cut = stdin[: stdin.index(b"#!/bin/bash\ntrue") + 5]
    output, received = run_loop(cut, tmp_path / "cut", login_host)
    assert received == [scripts[0].encode()]
    assert output.count(SUBMIT_MARKER) == 1


@pytest.mark.parametrize("login_host", LOGIN_HOSTS)
def test_sbatchs_refusal_is_that_jobs_outcome_and_a_garbled_header_stops_the_loop(
    tmp_path: Path, login_host: str
) -> None:
    # Given a second script whose sbatch refuses it, and a fourth record with no size
    refused = "#!/bin/bash\n#REFUSE\n"
    stdin = (
        f"a - 5\n#!/shb - {len(refused)}\n{refused}c debug 5\n#!/shd debug\n#!/she - 5\n#!/sh"
    ).encode()

    output, received = run_loop(stdin, tmp_path, login_host)

    # Then a, b and c got their outcomes (b's in sbatch's own words), d and e were never sent
    outcomes = parse_submit_loop(output, SlurmAdapter(FakeRunner()))
    assert received == [b"#!/sh", refused.encode(), b"#!/sh"]
    assert outcomes[0] == "100" and outcomes[2] == "102" and len(outcomes) == 3
    assert isinstance(outcomes[1], SchedulerError)
    assert not isinstance(outcomes[1], SchedulerUnavailable)
    assert "submission failed" in str(outcomes[1])


def test_the_command_is_one_line_without_a_history_mark() -> None:
    # Login shells take it inside single quotes: csh refuses a line break there and interactive
    # ones expand "!".
    command = shlex.join(SUBMIT_COMMAND)
    assert "\n" not in command and "!" not in command
    assert SUBMIT_COMMAND[4] == f"exec({SUBMIT_PROGRAM!r})"


@pytest.mark.parametrize("login_host", ["python3", "python3 before 3.8"])
def test_a_login_host_without_sbatch_refuses_each_job_with_the_reason(
    tmp_path: Path, login_host: str
) -> None:
    # Given a login host whose PATH has the shell and Python but no sbatch
    (tmp_path / "bin").mkdir()
    for tool in ("sh", "python3"):
        found = shutil.which(tool, path="/usr/bin:/bin")
        assert found is not None
        if tool == "python3" and login_host == "python3 before 3.8":
            (tmp_path / "bin" / tool).write_text(OLD_PYTHON.format(python=found))
            (tmp_path / "bin" / tool).chmod(0o755)
        else:
            (tmp_path / "bin" / tool).symlink_to(found)
    stdin = b"a - 5\n#!/shb - 5\n#!/sh"
    env = {"PATH": str(tmp_path / "bin")}
    argv = ["/bin/sh", *SUBMIT_COMMAND[1:]]
    result = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=30)
    # Then each job is refused (exit 127) in words that say so, and the loop went on
    outcomes = parse_submit_loop(result.stdout.decode(), SlurmAdapter(FakeRunner()))
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert isinstance(outcome, SchedulerError) and "No such file" in str(outcome)

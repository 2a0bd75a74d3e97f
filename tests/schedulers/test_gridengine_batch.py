"""Batched qsub, from what the remote loop prints (recorded from the real cell: data/
gridengine_submit_loop.txt): one outcome per job, in order, and a loop cut off leaves the rest
unknown (never refused, never made). The loop itself runs here in a real sh with a fake qsub."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from schedulers import gridengine
from schedulers.base import JobSpec, SchedulerError, SchedulerUnavailable
from schedulers.gridengine import (
    SUBMIT_COMMAND,
    SUBMIT_MARKER,
    SUBMIT_PROGRAM,
    GridEngineAdapter,
    parse_submit_loop,
)
from tests.schedulers.conftest import LOGIN_HOSTS, FakeRunner, data, ok, run_submit_loop

RECORDED = data("gridengine_submit_loop.txt")


@pytest.fixture(autouse=True)
def one_command_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job of a test in one command, so one scripted answer covers the batch."""
    monkeypatch.setattr(gridengine, "SUBMIT_PARALLEL", 1)


def spec(name: str, **changes: object) -> JobSpec:
    values: dict[str, object] = {
        "name": name,
        "partition": "all.q",
        "directives": ["-l h_rt=01:00:00"],
        "environment": {"ACTIVATE_AGENT_KEY": f"key-of-{name}", "ODD": "it's $(id)"},
        "command": "exec agent",
    }
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def sent(stdin: str | None) -> list[tuple[list[str], str, str]]:
    """The (header words, environment, script) records of a submit loop's input."""
    rest, records = (stdin or "").encode(), []
    while rest:
        head, _, rest = rest.partition(b"\n")
        words = head.decode().split()
        environment_size, size = int(words[1]), int(words[2])
        environment, script = rest[:environment_size], rest[environment_size:][:size]
        records.append((words, environment.decode(), script.decode()))
        rest = rest[environment_size + size :]
    return records


def test_the_recorded_answers_of_four_jobs_are_two_ids_and_two_refusals_in_order() -> None:
    outcomes = parse_submit_loop(RECORDED, GridEngineAdapter(FakeRunner()))

    assert [o if isinstance(o, str) else type(o) for o in outcomes] == [
        "23",
        SchedulerError,
        SchedulerError,
        "26",
    ]
    assert 'parallel environment "nosuchpe" does not exist' in str(outcomes[1])
    assert 'unknown queue "no-such-queue"' in str(outcomes[2])


def test_a_loop_cut_off_mid_way_leaves_the_jobs_it_did_not_answer_unknown() -> None:
    # Given the recorded answers cut off in the third job's answer (the connection dropped)
    cut = RECORDED[: RECORDED.index("Job was rejected")]
    runner = FakeRunner().on("sh", ok(cut, stderr="Connection reset"))

    outcomes = GridEngineAdapter(runner).submit_many([spec(f"pw-worker-{n}") for n in "abcd"])

    # Then the first two are what qsub said, the last two unknown (found by name before any retry)
    assert outcomes[0] == "23"
    assert isinstance(outcomes[1], SchedulerError)
    assert not isinstance(outcomes[1], SchedulerUnavailable)
    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes[2:])
    assert "Connection reset" in str(outcomes[2])


def test_an_unreachable_qmaster_is_unavailable_and_an_unreadable_answer_unknown() -> None:
    answers = (
        f"unable to contact qmaster using port 6444 on host vm\n{SUBMIT_MARKER} 1\n"
        f'Your job 7 ("x") has been submitted\n{SUBMIT_MARKER} 0\n'
    )
    runner = FakeRunner().on("sh", ok(answers))

    outcomes = GridEngineAdapter(runner).submit_many([spec("pw-a"), spec("pw-b")])

    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes)


def test_each_record_holds_the_environment_the_script_and_the_options_as_words() -> None:
    runner = FakeRunner().on("sh", ok(RECORDED))

    GridEngineAdapter(runner).submit_many([spec(f"pw-worker-{n}") for n in "abcd"])

    [(argv, stdin)] = runner.calls
    assert argv == SUBMIT_COMMAND
    records = sent(stdin)
    assert [words[0] for words, _, _ in records] == [f"pw-worker-{n}" for n in "abcd"]
    words, environment, script = records[0]
    assert words[3:] == shlex.split("-terse -N pw-worker-a -S /bin/bash -j y -o /dev/null -q all.q")
    assert environment == "ACTIVATE_AGENT_KEY=key-of-pw-worker-a\nODD='it'\"'\"'s $(id)'\n"
    assert "key-of" not in script and script.startswith("#!/bin/bash\n#$ -N pw-worker-a\n")
    assert "#$ -pe smp 1\n" in script and "#$ -l h_rt=01:00:00\n" in script
    assert '. "$HOME/.activate/jobs/pw-worker-a.env" || exit 1' in script


@pytest.mark.parametrize(
    "refused",
    [
        spec("a/b"),  # would name a file outside the environments' folder
        spec("pw-x", partition="all.q -b y"),
        spec("pw-x", environment={"A;touch ~/pwned;B": "1"}),
        spec("pw-x", directives=["-t 1-10"]),
    ],
)
def test_a_job_refused_before_sending_is_its_own_outcome_and_the_others_go(
    refused: JobSpec,
) -> None:
    runner = FakeRunner().on("sh", ok(f"31\n{SUBMIT_MARKER} 0\n32\n{SUBMIT_MARKER} 0\n"))

    outcomes = GridEngineAdapter(runner).submit_many([spec("pw-a"), refused, spec("pw-c")])

    assert outcomes[0] == "31" and outcomes[2] == "32"
    assert isinstance(outcomes[1], SchedulerError)
    assert not isinstance(outcomes[1], SchedulerUnavailable)
    [(_, stdin)] = runner.calls
    assert [words[0] for words, _, _ in sent(stdin)] == ["pw-a", "pw-c"]


def test_a_single_submit_goes_through_the_loop_and_raises_its_refusal() -> None:
    refused = FakeRunner().on("sh", ok(f"Unable to run job: denied\n{SUBMIT_MARKER} 1\n"))
    with pytest.raises(SchedulerError, match="denied"):
        GridEngineAdapter(refused).submit(spec("pw-a"))
    assert GridEngineAdapter(FakeRunner().on("sh", ok(RECORDED))).submit(spec("pw-a")) == "23"


def test_the_command_is_one_line_without_a_history_mark() -> None:
    command = shlex.join(SUBMIT_COMMAND)
    assert "\n" not in command and "!" not in command
    assert SUBMIT_COMMAND[4] == f"exec({SUBMIT_PROGRAM!r})"


FAKE_QSUB = """#!/bin/sh
n=$(ls "$KEPT" | wc -l)
mkdir "$KEPT/$n"
cat > "$KEPT/$n/script"
for word in "$@"; do echo "$word"; done > "$KEPT/$n/argv"
if grep -q REFUSE "$KEPT/$n/script"; then echo "Unable to run job: job rejected"; exit 1; fi
echo "$((100 + n))"
"""


@pytest.mark.parametrize("login_host", LOGIN_HOSTS)
def test_the_loop_gives_qsub_each_script_and_word_as_sent_and_never_a_record_cut_short(
    tmp_path: Path, login_host: str
) -> None:
    # Given three jobs: the second refused by qsub, the third's options a queue that would glob
    # ("q[1]" next to a file q1) and its environment a multibyte value with trailing newlines
    (tmp_path / "q1").touch()
    jobs = [
        ("pw-a", "A='1'\n", "#!/bin/bash\necho 'héllo $HOME `id`'\n\n", ["-N", "pw-a"]),
        ("pw-b", "", "#!/bin/bash\n#REFUSE\n", ["-N", "pw-b"]),
        ("pw-c", "B='é\n\n'\n", "#" * 20000, ["-N", "pw-c", "-q", "q[1]"]),
    ]
    stdin = "".join(
        f"{name} {len(env.encode())} {len(script.encode())} {' '.join(words)}\n{env}{script}"
        for name, env, script, words in jobs
    ).encode()

    output, kept = run_submit_loop(
        SUBMIT_COMMAND,
        stdin,
        tmp_path,
        login_host,
        fakes={"qsub": FAKE_QSUB},
        tools=("ls", "wc", "cat", "grep", "mkdir"),
    )

    # Then each job got its answer, qsub each script and word as sent, each job its own
    # environment file (the account's alone)
    outcomes = parse_submit_loop(output, GridEngineAdapter(FakeRunner()))
    assert outcomes[0] == "100" and outcomes[2] == "102" and len(outcomes) == 3
    assert isinstance(outcomes[1], SchedulerError) and "job rejected" in str(outcomes[1])
    for n, (name, env, script, words) in enumerate(jobs):
        assert (kept / str(n) / "script").read_bytes() == script.encode()
        assert (kept / str(n) / "argv").read_text().splitlines() == words
        written = tmp_path / "home" / ".activate" / "jobs" / f"{name}.env"
        assert written.read_bytes() == env.encode()
        assert written.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "home" / ".activate" / "jobs").stat().st_mode & 0o777 == 0o700

    # When the connection drops in the third job's script: it is never submitted, and its
    # environment never written
    cut = stdin[: stdin.index(b"#" * 100)]
    output, kept = run_submit_loop(
        SUBMIT_COMMAND,
        cut,
        tmp_path / "cut",
        login_host,
        fakes={"qsub": FAKE_QSUB},
        tools=("ls", "wc", "cat", "grep", "mkdir"),
    )
    assert len(parse_submit_loop(output, GridEngineAdapter(FakeRunner()))) == 2
    assert sorted(path.name for path in kept.iterdir()) == ["0", "1"]
    assert not (tmp_path / "cut" / "home" / ".activate" / "jobs" / "pw-c.env").exists()

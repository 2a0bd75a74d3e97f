"""Batched sbatch, from what the remote loop prints: one outcome per script, in order, and a
batch cut short leaves the rest unknown (never refused, never made)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.schedulers.conftest import FakeRunner, ok
from workers_app.schedulers import slurm
from workers_app.schedulers.base import JobSpec, SchedulerError, SchedulerUnavailable
from workers_app.schedulers.slurm import SUBMIT_LOOP, SUBMIT_MARKER, SlurmAdapter


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
    outcomes = SlurmAdapter(runner).submit_many([spec("a"), spec("b"), spec("c")])

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
    outcomes = SlurmAdapter(runner).submit_many([spec("a"), spec("b"), spec("c")])

    assert outcomes[0] == "201"
    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes[1:])


def test_an_unreadable_answer_is_unknown_and_a_controller_outage_is_unavailable() -> None:
    runner = FakeRunner().on(
        "sh",
        ok(answered(("Submitted batch job", 0), ("Unable to contact slurm controller", 1))),
    )
    outcomes = SlurmAdapter(runner).submit_many([spec("a"), spec("b")])

    assert all(isinstance(o, SchedulerUnavailable) for o in outcomes)


def test_a_spec_refused_before_sending_does_not_stop_the_others() -> None:
    runner = FakeRunner().on("sh", ok(answered(("301", 0), ("302", 0))))
    outcomes = SlurmAdapter(runner).submit_many(
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

    outcomes = SlurmAdapter(runner).submit_many([spec(f"w{n}") for n in range(12)])

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

    outcomes = SlurmAdapter(runner).submit_many([spec(name) for name in names])

    # Then two rounds of three commands of 33 or 34 scripts, none left to run alone, every
    # job sent once and in order
    shares = [[name for name, _, _ in sent(stdin)] for _, stdin in runner.calls]
    shares.sort(key=lambda share: names.index(share[0]))
    assert [len(share) for share in shares] == [33, 33, 34, 33, 33, 34]
    assert [name for share in shares for name in share] == names
    assert outcomes == ["7"] * 200


def run_loop(stdin: bytes, tmp_path: Path) -> tuple[str, list[bytes]]:
    """SUBMIT_LOOP in a real sh, with an sbatch on PATH that keeps each script it is given."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\nn=$(ls "$KEPT" | wc -l)\ncat > "$KEPT/$n"\necho "$((100 + n))"\n')
    fake.chmod(0o755)
    kept = tmp_path / "kept"
    kept.mkdir()
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "KEPT": str(kept)}
    result = subprocess.run(
        ["sh", "-c", SUBMIT_LOOP], input=stdin, capture_output=True, env=env, timeout=30
    )
    scripts = [(kept / str(n)).read_bytes() for n in range(len(list(kept.iterdir())))]
    return result.stdout.decode(), scripts


def test_scripts_reach_sbatch_byte_for_byte_and_one_cut_short_is_never_submitted(
    tmp_path: Path,
) -> None:
    scripts = ["#!/bin/bash\necho 'héllo $HOME `id`'\n\n\n", "#!/bin/bash\ntrue", "#" * 20000]
    stdin = "".join(f"n{i} - {len(s.encode())}\n{s}" for i, s in enumerate(scripts)).encode()

    output, received = run_loop(stdin, tmp_path)

    assert received == [s.encode() for s in scripts]
    assert output.count(f"{SUBMIT_MARKER} 0") == 3
    # The connection drops in the middle of the second script: only the first was submitted.
    cut = stdin[: stdin.index(b"#!/bin/bash\ntrue") + 5]
    output, received = run_loop(cut, tmp_path / "cut")
    assert received == [scripts[0].encode()]
    assert output.count(SUBMIT_MARKER) == 1

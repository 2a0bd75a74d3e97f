"""Batched sbatch, from what the remote loop prints: one outcome per script, in order, and a
batch cut short leaves the rest unknown (never refused, never made)."""

from __future__ import annotations

import base64

import pytest

from tests.schedulers.conftest import FakeRunner, ok
from workers_app.schedulers import slurm
from workers_app.schedulers.base import JobSpec, SchedulerError, SchedulerUnavailable
from workers_app.schedulers.slurm import SUBMIT_MARKER, SlurmAdapter


@pytest.fixture(autouse=True)
def one_command_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every script of a test in one command, so one scripted answer covers the batch."""
    monkeypatch.setattr(slurm, "SUBMIT_PARALLEL", 1)


def spec(name: str, **overrides: object) -> JobSpec:
    values: dict[str, object] = {"name": name, "partition": "debug", "directives": []}
    values.update(overrides)
    return JobSpec(**values)  # type: ignore[arg-type]


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
    lines = (stdin or "").splitlines()
    assert [line.split()[:2] for line in lines] == [["a", "debug"], ["b", "debug"], ["c", "debug"]]
    script = base64.b64decode(lines[0].split()[2]).decode()
    assert script.startswith("#!/bin/bash\n") and "--job-name=a" in script


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
    assert [line.split()[0] for line in (stdin or "").splitlines()] == ["a", "c"]


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

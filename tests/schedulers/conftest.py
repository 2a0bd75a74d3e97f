from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schedulers.base import CommandResult, JobInfo, Phase, SchedulerAdapter
from tests.core.transport.conftest import ssh  # noqa: F401 (the fixture, for the adapters' tests)
from workers_app.cluster_access import close_all_connections

DATA = Path(__file__).parent / "data"


def data(name: str) -> str:
    return (DATA / name).read_text()


def ok(stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(exit_status=0, stdout=stdout, stderr=stderr)


def failed(stderr: str, exit_status: int = 1, stdout: str = "") -> CommandResult:
    return CommandResult(exit_status=exit_status, stdout=stdout, stderr=stderr)


@dataclass
class FakeRunner:
    """Answers each program (argv[0]) from a queue of results and records every call."""

    answers: dict[str, list[CommandResult]] = field(default_factory=dict)
    calls: list[tuple[list[str], str | None]] = field(default_factory=list)

    def on(self, program: str, *results: CommandResult) -> FakeRunner:
        self.answers.setdefault(program, []).extend(results)
        return self

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> CommandResult:
        self.calls.append((list(argv), stdin))
        queue = self.answers.get(argv[0])
        if not queue:
            raise AssertionError(f"unexpected command {argv!r}")
        return queue.pop(0) if len(queue) > 1 else queue[0]

    @property
    def programs(self) -> list[str]:
        return [argv[0] for argv, _ in self.calls]


@pytest.fixture(autouse=True)
def _close_cached_connections() -> Iterator[None]:
    yield
    close_all_connections()


@pytest.fixture
def unique() -> str:
    """A job-name prefix of this test alone: the cluster is shared with other test runs."""
    return f"pwtest-{uuid.uuid4().hex[:8]}-"


def wait_for(
    adapter: SchedulerAdapter,
    job_id: str,
    until: Callable[[JobInfo | None], bool],
    *,
    timeout: float = 30.0,
    interval: float = 0.5,
) -> JobInfo | None:
    deadline = time.monotonic() + timeout
    while True:
        info = adapter.query([job_id]).get(job_id)
        if until(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {info} after {timeout}s")
        time.sleep(interval)


def is_running(info: JobInfo | None) -> bool:
    return info is not None and info.phase is Phase.RUNNING


def has_ended(info: JobInfo | None) -> bool:
    return info is None or info.phase is Phase.ENDED

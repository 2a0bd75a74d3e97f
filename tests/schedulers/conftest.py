from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.transport.connection import SSHConnection
from schedulers.base import CommandResult, JobInfo, Phase, SchedulerAdapter
from schedulers.slurm import SlurmAdapter
from tests.core.transport.conftest import ssh  # noqa: F401 (the fixture, for the adapters' tests)
from workers_app.cluster_access import close_all_connections

DATA = Path(__file__).parent / "data"
# An environment value no quoting of ours may let the shell read.
HOSTILE = 'it\'s "quoted" $(touch ~/pwned) `id` ; rm -rf ~ \n second line \\ end'
# Keeps a Slurm job pending: users may not hold their jobs through directives, but may delay them.
NOT_BEFORE_AN_HOUR = "--begin=now+3600"


@pytest.fixture(scope="module")
def slurm(ssh: SSHConnection) -> SlurmAdapter:  # noqa: F811 (ssh: the fixture imported above)
    return SlurmAdapter(ssh)


@pytest.fixture
def submitted(slurm: SlurmAdapter) -> Iterator[list[str]]:
    """Ids of the Slurm jobs a test submits (an array's number: all its tasks); all are
    cancelled afterwards."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        slurm.cancel(job_id)


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


# The login hosts a submit loop (base.submit_command) is run on: with python3, with a python3
# older than 3.8 (no os.posix_spawnp: the loop starts the submit command by fork), and with the
# shell's tools alone.
LOGIN_HOSTS = ["python3", "python3 before 3.8", "no python3"]
SHADOWED = "#!/bin/sh\necho 'the loop ran $0' >&2\nexit 1\n"
OLD_PYTHON = """#!/bin/sh
[ "$1 $2 $3" = "-I -S -c" ] || exit 99
exec {python} -I -S -c 'import os, sys; del os.posix_spawnp; exec(sys.argv[1])' "$4"
"""


def run_submit_loop(
    command: list[str],
    stdin: bytes,
    tmp_path: Path,
    login_host: str,
    *,
    fakes: dict[str, str],
    tools: tuple[str, ...],
) -> tuple[str, Path]:
    """A submit loop's command in a real sh, with ``fakes`` (name -> shell script) on PATH and
    $KEPT a folder of their own: on a login host with python3 (where `head` fails, so the shell
    loop cannot pass unseen), or with ``tools`` alone (no python3 on PATH). Its stdout, and
    $KEPT; $HOME is ``tmp_path/home``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    for name, text in fakes.items():
        (bin_ / name).write_text(text)
    if login_host.startswith("python3"):
        (bin_ / "head").write_text(SHADOWED)
        if login_host == "python3 before 3.8":
            (bin_ / "python3").write_text(OLD_PYTHON.format(python=sys.executable))
        path = f"{bin_}:{os.environ['PATH']}"
    else:
        for tool in ("sh", "head", *tools):
            (bin_ / tool).symlink_to(shutil.which(tool) or tool)
        path = str(bin_)
    for tool in bin_.iterdir():
        if not tool.is_symlink():
            tool.chmod(0o755)
    kept = tmp_path / "kept"
    kept.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PATH": path, "KEPT": str(kept), "HOME": str(home)}
    argv = [shutil.which("sh") or "sh", *command[1:]]
    result = subprocess.run(
        argv, input=stdin, capture_output=True, env=env, timeout=30, cwd=tmp_path
    )
    assert "the loop ran" not in result.stderr.decode()
    return result.stdout.decode(), kept

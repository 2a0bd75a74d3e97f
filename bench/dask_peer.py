"""dask-jobqueue, the peer of the submission benchmark: an environment of its own and one race.

The peer is no dependency of the platform: it is installed from PyPI into a venv the bench makes
on first use, under ACTIVATE_BENCH_PEERS (default: `.bench-peers/` in the checkout, git-ignored).
The venv is made with the cluster account's own `python3` and left world-readable, so the peer
runs as that account (`runuser`), where the scheduler is, as the platform's jobs are submitted.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness import REPO, HarnessError
from harness.cluster import SshTarget
from harness.waiting import wait_until

PACKAGE = "dask-jobqueue"
# Pinned, so the figures compare against the same peer run after run.
VERSION = "0.9.0"
PEERS_VARIABLE = "ACTIVATE_BENCH_PEERS"
SCRIPT = Path(__file__).with_name("dask_peer_main.py")


@dataclass
class PeerRace:
    jobs: int
    elapsed: float
    version: str
    notes: list[str]


def peer_python(target: SshTarget) -> tuple[Path, str]:
    """The peer venv's interpreter and dask-jobqueue's version, the venv made if missing."""
    root = Path(os.environ.get(PEERS_VARIABLE) or REPO / ".bench-peers")
    venv = root / "dask-jobqueue"
    python = venv / "bin" / "python"
    if not python.exists():
        # Made by root with the account's interpreter: the account can run it, root can pip.
        interpreter = _as_account(target, "python3", "-c", "import sys; print(sys.executable)")
        root.mkdir(parents=True, exist_ok=True)
        print(f"  making the peer's venv {venv} ({PACKAGE} from PyPI)", flush=True)
        _run([interpreter, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "--quiet", f"{PACKAGE}=={VERSION}"])
    probe = "import dask_jobqueue; print(dask_jobqueue.__version__)"
    try:
        version = _as_account(target, str(python), "-c", probe)
    except HarnessError as exc:
        raise HarnessError(
            f"the cluster account {target.user} cannot run {PACKAGE} from {venv} ({exc}); set "
            f"{PEERS_VARIABLE} to a folder it can read, or remove the venv to remake it"
        ) from exc
    return python, version


@dataclass(frozen=True)
class PeerScheduler:
    """Where the peer submits: its scheduler (the platform's name for it), the partition or
    queue, and how the bench cancels jobs of a name there."""

    kind: str
    queue: str
    cancel_names: Callable[[set[str]], None]

    @property
    def cluster_class(self) -> str:
        return CLUSTER_CLASSES[self.kind]


CLUSTER_CLASSES = {"slurm": "SLURMCluster", "gridengine": "SGECluster"}


def race(
    target: SshTarget,
    python: Path,
    version: str,
    job_seen: dict[str, tuple[str, float]],
    *,
    scheduler: PeerScheduler,
    jobs: int,
    job_name: str,
    directive: str,
) -> PeerRace:
    """SLURMCluster(...) or SGECluster(...).scale(jobs=N) as the cluster account: from the call
    to the last of its N jobs seen listed (``job_seen``: job id -> (name, first seen), a
    JobWatcher's).

    A peer whose cluster fails to start (it happened once on a loaded machine: its scheduler
    was not running yet) is started again, once; jobs it made are cancelled either way.
    """
    try:
        return _race(target, python, version, job_seen, scheduler, jobs, job_name, directive)
    except PeerNotStarted as exc:
        print(f"  dask-jobqueue did not start, trying again: {exc}", flush=True)
        return _race(target, python, version, job_seen, scheduler, jobs, job_name, directive)


class PeerNotStarted(HarnessError):
    pass


def _race(
    target: SshTarget,
    python: Path,
    version: str,
    job_seen: dict[str, tuple[str, float]],
    scheduler: PeerScheduler,
    jobs: int,
    job_name: str,
    directive: str,
) -> PeerRace:
    with (
        tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp,
        open(Path(tmp) / "peer.log", "w+") as log,
    ):
        Path(tmp).chmod(0o777)
        argv = target.as_user(
            str(python),
            "-I",  # not bench/ on sys.path: its modules' names would shadow others
            str(SCRIPT),
            f"--scheduler={scheduler.kind}",
            f"--jobs={jobs}",
            f"--job-name={job_name}",
            f"--partition={scheduler.queue}",
            f"--directive={directive}",
            f"--local-directory={tmp}",
        )
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
        assert process.stdin is not None and process.stdout is not None
        try:
            said = _read_until(process.stdout, "scaling ", log)
            started = float(said.split()[1])

            def made() -> list[float]:
                return [at for name, at in list(job_seen.values()) if name == job_name]

            if not wait_until(lambda: len(made()) >= jobs, timeout=300):
                raise HarnessError(f"dask-jobqueue: {len(made())} of {jobs} jobs listed")
            elapsed = max(made()) - started
            closing = time.monotonic()
            process.stdin.write("close\n")
            process.stdin.flush()
            _read_until(process.stdout, "closed", log, error=HarnessError)
            closed = time.monotonic() - closing
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            scheduler.cancel_names({job_name})
    notes = [
        f"dask-jobqueue {version} from PyPI in a venv of the bench's own, run as the cluster "
        f"account {target.user} where the scheduler is: {scheduler.cluster_class}("
        f"job_extra_directives=['{directive}'], ...).scale(jobs=N), timed from the call to the "
        "last job seen listed by the same watcher as the platform's (its Dask scheduler's "
        "start-up not counted); "
        f"its open-file limit raised to the hard one (it runs every submit command at once); "
        f"cluster.close() then cancelled its {jobs} jobs in {closed:.1f} s",
    ]
    return PeerRace(jobs, elapsed, version, notes)


def _read_until(
    stream: IO[str], prefix: str, log: IO[str], *, error: type[HarnessError] = PeerNotStarted
) -> str:
    for line in stream:
        if line.startswith(prefix):
            return line.strip()
    log.seek(0)
    # Its tracebacks' own lines are indented: the unindented ones say what failed.
    said = [line for line in log.read().splitlines() if line and not line[0].isspace()]
    raise error(f"dask-jobqueue ended before {prefix.strip()!r}: {said[-6:]}")


def _as_account(target: SshTarget, *argv: str) -> str:
    return _run(target.as_user(*argv))


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise HarnessError(f"{' '.join(argv[:4])} failed: {result.stderr.strip()[-500:]}")
    return result.stdout.strip()

"""What benchmarks and drills share: a ready database, the test cluster, and its environments.

Everything here works on a fresh clone: the database named by DATABASE_URL is created when it
is missing and migrated, and the cluster comes from the files `scripts/testcluster.sh up`
writes under .cluster/.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from tests.testcluster import NOT_UP, SshTarget, target_fields

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workers_app.models import Cluster, Environment

REPO = Path(__file__).resolve().parent.parent
CLUSTER_DIR = REPO / ".cluster"
# Used when the caller sets nothing (make bench / make drills set both).
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/activate_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/5"
CLUSTER_NAME = "bench-slurm"
HELD_ENVIRONMENT = "held"
RUN_ENVIRONMENT = "run"
JOB_NAME_PREFIX = "pw-worker-"


class HarnessError(Exception):
    """The machine is not ready for a benchmark or drill (no cluster, no PostgreSQL, ...)."""


# -- database and Django --------------------------------------------------------------------


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database named in ``url`` if it does not exist yet."""
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise HarnessError(f"benchmarks and drills need PostgreSQL; DATABASE_URL is {url!r}")
    name = unquote(parsed.path.lstrip("/"))
    params = {
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 5432,
        "user": unquote(parsed.username or "postgres"),
        "dbname": "postgres",
        "autocommit": True,
    }
    if parsed.password:
        params["password"] = unquote(parsed.password)
    try:
        with psycopg.connect(**params) as conn:  # type: ignore[arg-type]
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"created database {name}", file=sys.stderr)
    except psycopg.OperationalError as exc:
        raise HarnessError(f"cannot reach PostgreSQL at {parsed.hostname}: {exc}") from None


def job_name(public_id: str) -> str:
    """The scheduler job name of a worker of this run's installation."""
    from workers_app.models import job_name_for

    return job_name_for(public_id)


def prepare_django(installation: str = "bench") -> None:
    """Point Django at the benchmark database and Redis, create and migrate the database."""
    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    os.environ.setdefault("ACTIVATE_LOG_LEVEL", "WARNING")
    os.environ.setdefault("ACTIVATE_INSTALLATION_ID", installation)
    os.environ["DJANGO_SETTINGS_MODULE"] = "activate.settings.test"
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# -- the test cluster -----------------------------------------------------------------------


@dataclass(frozen=True)
class TestCluster(SshTarget):
    """The single-node Slurm cluster with its sshd on loopback (scripts/testcluster.sh)."""

    @classmethod
    def from_files(cls) -> TestCluster:
        fields = target_fields()
        if fields is None:
            raise HarnessError(NOT_UP)
        return cls(**fields)  # type: ignore[arg-type]

    def ssh_argv(self, *remote: str) -> list[str]:
        """The real OpenSSH client, a new connection each time (no multiplexing)."""
        return [
            "ssh",
            "-i",
            self.key_path,
            "-p",
            str(self.port),
            "-o",
            f"UserKnownHostsFile={CLUSTER_DIR / 'known_hosts'}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-o",
            "LogLevel=ERROR",
            f"{self.user}@{self.host}",
            *remote,
        ]

    def as_user(self, *argv: str) -> list[str]:
        """A local command run as the cluster account (the "local sbatch" limit)."""
        return ["runuser", "-u", self.user, "--", *argv]

    def jobs(self, *, all_states: bool = False) -> dict[str, str]:
        """Jobs of the cluster account: id -> name (live ones, or also recently ended ones)."""
        argv = ["squeue", "--noheader", "-u", self.user, "-o", "%i|%j"]
        if all_states:
            argv.insert(2, "--states=all")
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        jobs = {}
        for line in result.stdout.splitlines():
            job_id, _, name = line.strip().partition("|")
            if job_id:
                jobs[job_id] = name
        return jobs

    def job_names(self, *, all_states: bool = False) -> list[str]:
        return list(self.jobs(all_states=all_states).values())

    def cancel_ids(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), 200):
            subprocess.run(
                ["scancel", *ids[start : start + 200]],
                capture_output=True,
                timeout=120,
                check=False,
            )

    def cancel_names(self, names: Iterable[str]) -> None:
        """Cancel this run's jobs by name only: other people's jobs share the account."""
        wanted = set(names)
        self.cancel_ids(job_id for job_id, name in self.jobs().items() if name in wanted)

    def sbatch_held(self, names: list[str]) -> list[str]:
        """Submit held sleep jobs with one local sbatch each (in one shell): their ids."""
        if not names:
            return []
        script = "".join(
            f"sbatch --parsable --hold --job-name={name} --partition={self.partition} "
            "--output=/dev/null --time=00:10:00 --wrap='sleep 600'\n"
            for name in names
        )
        result = subprocess.run(
            self.as_user("bash", "-s"),
            input=script,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        ids = [line.split(";")[0] for line in result.stdout.split()]
        if result.returncode != 0 or len(ids) != len(names):
            self.cancel_ids(ids)
            raise HarnessError(f"sbatch failed: {result.stderr.strip()[:500]}")
        return ids


# The test cluster's sshd logs one line per accepted connection (scripts/testcluster.sh).
SSHD_LOG = Path("/var/log/sshd_activate_test.log")


def sshd_connections() -> int:
    """Connections the test cluster's sshd has accepted so far (-1 if its log is unreadable)."""
    try:
        return SSHD_LOG.read_text(errors="replace").count("Accepted publickey")
    except OSError:
        return -1


def slurm_version() -> str:
    result = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip()


def openssh_version() -> str:
    result = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    return (result.stderr or result.stdout).strip()


# -- platform objects -----------------------------------------------------------------------


def run_id() -> str:
    """A short tag that names this run's objects apart from everyone else's."""
    return secrets.token_hex(3)


def register_cluster(target: TestCluster) -> Cluster:
    from workers_app.models import Cluster, Reachability

    cluster = Cluster.objects.filter(name=CLUSTER_NAME).first() or Cluster(name=CLUSTER_NAME)
    cluster.host, cluster.port, cluster.username = target.host, target.port, target.user
    cluster.host_key, cluster.scheduler = target.host_key, "slurm"
    cluster.reachability = Reachability.UNKNOWN
    cluster.set_private_key(target.private_key)
    cluster.save()
    return cluster


def ensure_environments(cluster: Cluster, partition: str) -> tuple[Environment, Environment]:
    """Two environments: "held" (jobs wait on hold, so many do not swamp the node) and "run"."""
    from workers_app.models import Environment, EnvironmentField, FieldKind

    made = []
    for name, directives in ((HELD_ENVIRONMENT, "--hold"), (RUN_ENVIRONMENT, "")):
        env, _ = Environment.objects.update_or_create(
            cluster=cluster, name=name, defaults={"partition": partition, "is_active": True}
        )
        EnvironmentField.objects.update_or_create(
            environment=env,
            name="walltime",
            defaults={"directive": "--time={value}", "default": "00:10:00", "position": 0},
        )
        EnvironmentField.objects.update_or_create(
            environment=env,
            name="directives",
            defaults={"kind": FieldKind.DIRECTIVES, "default": directives, "position": 1},
        )
        made.append(env)
    return made[0], made[1]


def bench_user(username: str = "bench") -> User:
    from django.contrib.auth.models import User

    user, _ = User.objects.get_or_create(username=username)
    return user


def forget_workers() -> None:
    """Start from an empty worker table (this is the benchmark's own database)."""
    from workers_app.models import Worker

    Worker.objects.all().delete()


def wait_until(predicate: Callable[[], object], *, timeout: float, interval: float = 0.2) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def testcluster(command: str) -> None:
    """scripts/testcluster.sh stop-sshd | start-sshd | stop-slurmctld | start-slurmctld."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "testcluster.sh"), command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise HarnessError(f"testcluster.sh {command} failed: {result.stderr.strip()[-500:]}")

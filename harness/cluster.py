"""The test cluster that scripts/testcluster.sh runs: where its sshd is, the accounts that may log
in, the cluster account's jobs, and the script's outage commands."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO, HarnessError

CLUSTER_DIR = REPO / ".cluster"
CLUSTER_ENV = CLUSTER_DIR / "cluster.env"
KNOWN_HOSTS = CLUSTER_DIR / "known_hosts"
NOT_UP = "no test cluster: run `scripts/testcluster.sh up` (make test does)"
# The test cluster's sshd logs one line per accepted connection (scripts/testcluster.sh).
SSHD_LOG = Path("/var/log/sshd_activate_test.log")
ACCOUNT_KEY_PREFIX = "ACTIVATE_TEST_ACCOUNT_KEY_"


@dataclass(frozen=True)
class SshTarget:
    """One login on the test cluster: its sshd, the account and its private key file."""

    host: str
    port: int
    user: str
    key_path: str
    host_key: str
    partition: str
    # The per-user accounts next to the shared one: username -> private key file.
    accounts: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def running(cls) -> SshTarget:
        """The test cluster as its files say (environment variables first)."""
        values = read_cluster_env()
        if "ACTIVATE_TEST_SSH_HOST" not in values:
            raise HarnessError(NOT_UP)
        names = [n for n in values.get("ACTIVATE_TEST_ACCOUNTS", "").split(",") if n]
        return cls(
            host=values["ACTIVATE_TEST_SSH_HOST"],
            port=int(values["ACTIVATE_TEST_SSH_PORT"]),
            user=values["ACTIVATE_TEST_SSH_USER"],
            key_path=values["ACTIVATE_TEST_SSH_KEY"],
            host_key=values["ACTIVATE_TEST_SSH_HOST_KEY"],
            partition=values.get("ACTIVATE_TEST_SLURM_PARTITION", "debug"),
            accounts={name: values[ACCOUNT_KEY_PREFIX + name] for name in names},
        )

    @property
    def private_key(self) -> str:
        return Path(self.key_path).read_text()

    # -- commands ---------------------------------------------------------------------------

    def ssh_argv(self, *remote: str, control_dir: Path | None = None) -> list[str]:
        """The real OpenSSH client: a new connection each time, or with ``control_dir`` one
        master connection its sockets live in, shared by every call (ControlMaster=auto, as a
        careful user configures it; `close_master` ends it)."""
        options = {
            "UserKnownHostsFile": str(KNOWN_HOSTS),
            "GlobalKnownHostsFile": "/dev/null",
            "StrictHostKeyChecking": "yes",
            "BatchMode": "yes",
            "IdentitiesOnly": "yes",
            "ControlMaster": "no" if control_dir is None else "auto",
            "ControlPath": "none" if control_dir is None else f"{control_dir}/%C",
            "LogLevel": "ERROR",
        }
        if control_dir is not None:
            options["ControlPersist"] = "60"
        argv = ["ssh", "-i", self.key_path, "-p", str(self.port)]
        for name, value in options.items():
            argv += ["-o", f"{name}={value}"]
        return [*argv, f"{self.user}@{self.host}", *remote]

    def as_user(self, *argv: str) -> list[str]:
        """A local command run as the cluster account (the "local sbatch" limit)."""
        return ["runuser", "-u", self.user, "--", *argv]

    # -- the account's jobs -----------------------------------------------------------------

    def jobs(self, *, all_states: bool = False) -> dict[str, str]:
        """Jobs of the account: id -> key (live ones, or also recently ended ones): a job's name,
        or a task of an array by its array's name and index (``listing_key``)."""
        argv = ["squeue", "--noheader", "--array", "-u", self.user, "-o", "%i|%j"]
        if all_states:
            argv.insert(2, "--states=all")
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        jobs = {}
        for line in result.stdout.splitlines():
            job_id, _, name = line.strip().partition("|")
            if job_id:
                jobs[job_id] = listing_key(job_id, name)
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
        return self.sbatch_locally(
            [
                f"sbatch --parsable --hold --job-name={name} --partition={self.partition} "
                "--output=/dev/null --time=00:10:00 --wrap='sleep 600'"
                for name in names
            ]
        )

    def close_master(self, control_dir: Path) -> None:
        argv = self.ssh_argv(control_dir=control_dir)
        subprocess.run([argv[0], "-O", "exit", *argv[1:]], capture_output=True, check=False)

    def sbatch_locally(self, commands: list[str]) -> list[str]:
        """Run `sbatch --parsable` command lines as the account, in one local shell: the job
        ids, one per line. When any fails, those that were made are cancelled."""
        if not commands:
            return []
        result = subprocess.run(
            self.as_user("bash", "-s"),
            input="".join(f"{line}\n" for line in commands),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        ids = [line.split(";")[0] for line in result.stdout.split()]
        if result.returncode != 0 or len(ids) != len(commands):
            self.cancel_ids(ids)
            raise HarnessError(f"local sbatch failed: {result.stderr.strip()[:500]}")
        return ids


def squeue_names(target: SshTarget) -> list[str]:
    """Names of the account's live jobs."""
    return target.job_names()


def read_cluster_env() -> dict[str, str]:
    """ACTIVATE_TEST_* from the environment, then from .cluster/cluster.env."""
    values = {k: v for k, v in os.environ.items() if k.startswith("ACTIVATE_TEST_")}
    if CLUSTER_ENV.exists():
        for line in CLUSTER_ENV.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values.setdefault(key.strip(), value.strip())
    return values


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


def sshd_connections() -> int:
    """Connections the test cluster's sshd has accepted so far (-1 if its log is unreadable)."""
    try:
        return SSHD_LOG.read_text(errors="replace").count("Accepted publickey")
    except OSError:
        return -1


def listing_key(job_id: str, name: str) -> str:
    """A job as squeue --array lists it (%i|%j), by its key: a task of an array ("12_3") by
    its array's name and index (schedulers.base.task_key)."""
    from schedulers.base import task_key

    array, underscore, index = job_id.partition("_")
    return task_key(name, index) if underscore and array.isdigit() and index.isdigit() else name

"""Each scheduler of the test cluster (scripts/testcluster.sh), spoken to with its own commands,
as a user of it would: which jobs an account has, who owns one, and what another user's commands
against a job are. Tests that prove the same behaviour on every scheduler take a Cell."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from harness import HarnessError
from harness.cluster import SshTarget, listing_key, read_cluster_env


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


@dataclass(frozen=True)
class Cell(ABC):
    kind: str  # the cluster's scheduler, as the platform names it
    queue: str  # the partition or queue environments use
    # A directive (one users may set) that keeps a job waiting for days.
    hold_directive: str
    # The variable in which a job's processes find its id.
    job_id_variable: str
    # The shortest wall time the scheduler enforces to the second or so (HH:MM:SS).
    shortest_walltime: str

    @abstractmethod
    def jobs(self, user: str) -> dict[str, str]:
        """The user's live jobs: id -> name."""

    def job_names(self, user: str) -> list[str]:
        return list(self.jobs(user).values())

    @abstractmethod
    def owner(self, job_id: str) -> str:
        """The Unix user the scheduler runs the job as ("" when it does not list it)."""

    @abstractmethod
    def cancel_ids(self, job_ids: Iterable[str]) -> None:
        """Cancel jobs as root, whoever owns them (tests clean up after themselves)."""

    def cancel_names(self, user: str, names: Iterable[str]) -> None:
        wanted = set(names)
        self.cancel_ids(job_id for job_id, name in self.jobs(user).items() if name in wanted)

    @abstractmethod
    def cancel_argv(self, job_id: str) -> list[str]:
        """What a user runs to cancel a job."""

    @abstractmethod
    def enter_argv(self, job_id: str, node: str, argv: list[str]) -> list[str]:
        """What a user runs to start argv inside a running job on its node."""

    @abstractmethod
    def shown_argv(self, user: str, job_id: str) -> list[tuple[str, ...]]:
        """What a user runs to see another user's jobs and one job in detail."""


class SlurmCell(Cell):
    def jobs(self, user: str) -> dict[str, str]:
        listed = _run(["squeue", "--noheader", "--array", "-u", user, "-o", "%i|%j"])
        pairs = (line.strip().split("|", 1) for line in listed.splitlines() if line.strip())
        return {job_id: listing_key(job_id, name) for job_id, name in pairs}

    def owner(self, job_id: str) -> str:
        return _run(["squeue", "-h", "-j", job_id, "-o", "%u"]).strip()

    def cancel_ids(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[start : start + 200]], capture_output=True, timeout=120)

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["scancel", job_id]

    def enter_argv(self, job_id: str, node: str, argv: list[str]) -> list[str]:
        return ["srun", f"--jobid={job_id}", "--overlap", "--ntasks=1", *argv]

    def shown_argv(self, user: str, job_id: str) -> list[tuple[str, ...]]:
        return [
            ("squeue", "-u", user, "-h", "-o", "%i %j %u %o"),
            ("scontrol", "show", "job", "-dd", job_id),
            ("scontrol", "write", "batch_script", job_id, "-"),
        ]


def slurm_cell(target: SshTarget) -> Cell:
    # Users may not hold their jobs through directives, but may delay them (Reason=BeginTime).
    # Slurm counts wall time in minutes.
    return SlurmCell("slurm", target.partition, "--begin=now+7days", "SLURM_JOB_ID", "00:01:00")


class GridEngineCell(Cell):
    def _listed(self, user: str) -> ET.Element:
        return ET.fromstring(_run(["qstat", "-xml", "-u", user]))  # noqa: S314 (our own cell)

    def jobs(self, user: str) -> dict[str, str]:
        return {
            entry.findtext("JB_job_number", ""): entry.findtext("JB_name", "")
            for entry in self._listed(user).iter("job_list")
        }

    def owner(self, job_id: str) -> str:
        for entry in self._listed("*").iter("job_list"):
            if entry.findtext("JB_job_number") == job_id:
                return entry.findtext("JB_owner", "")
        return ""

    def cancel_ids(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), 200):
            subprocess.run(
                ["qdel", "-f", *ids[start : start + 200]], capture_output=True, timeout=120
            )

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["qdel", job_id]

    def hold_many(self, user: str, names: list[str]) -> list[str]:
        """Held sleep jobs submitted by ``user`` with one local qsub each (in one shell)."""
        lines = "".join(
            f"qsub -terse -h -N {name} -q {self.queue} -o /dev/null -j y -b y sleep 600\n"
            for name in names
        )
        result = subprocess.run(
            ["runuser", "-u", user, "--", "bash", "-s"],
            input=lines,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            cwd="/",
        )
        ids = result.stdout.split()
        if result.returncode != 0 or len(ids) != len(names):
            self.cancel_ids(ids)
            raise HarnessError(f"local qsub failed: {result.stderr.strip()[:500]}")
        return ids

    def enter_argv(self, job_id: str, node: str, argv: list[str]) -> list[str]:
        return ["env", f"JOB_ID={job_id}", "SGE_TASK_ID=undefined", "qrsh", "-inherit", node, *argv]

    def shown_argv(self, user: str, job_id: str) -> list[tuple[str, ...]]:
        # The execution host keeps each job's script where every local user can read it.
        return [
            ("qstat", "-u", user),
            ("qstat", "-j", job_id),
            ("sh", "-c", f"cat {GRIDENGINE_SPOOL}/*/job_scripts/{job_id}"),
        ]


GRIDENGINE_SPOOL = "/var/spool/gridengine/execd"


def gridengine_cell(target: SshTarget) -> Cell:
    queue = read_cluster_env().get("ACTIVATE_TEST_SGE_QUEUE", "all.q")
    # A start time (qsub -a) years away keeps it waiting, as Slurm's --begin does.
    return GridEngineCell("gridengine", queue, "-a 209901010000", "JOB_ID", "00:00:20")


CELLS = {"slurm": slurm_cell, "gridengine": gridengine_cell}
KINDS = tuple(CELLS)


def cell(kind: str, target: SshTarget | None = None) -> Cell:
    """The test cluster's cell of this scheduler."""
    target = target or SshTarget.running()
    if kind not in CELLS:
        raise ValueError(f"the test cluster runs no {kind!r} (it runs {', '.join(KINDS)})")
    return CELLS[kind](target)

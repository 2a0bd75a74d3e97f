"""The agents the platform's jobs start on the node (this machine), found by their environment.

Freezing one (SIGSTOP) is a node that "disappears": the agent stops answering while its job keeps
the allocation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from harness import REPO
from node import activate_agent

if TYPE_CHECKING:
    from workers_app.models import Worker


def agent_pids(public_id: str) -> list[int]:
    """Processes on this node whose environment names the worker: its agent."""
    marker = f"ACTIVATE_WORKER_ID={public_id}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and b"python" in cmdline:
            pids.append(int(proc.name))
    return pids


def freeze_agent(public_id: str) -> list[int]:
    """SIGSTOP the worker's agent: the pids frozen (none when no agent was found)."""
    pids = agent_pids(public_id)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def thaw(pids: Iterable[int]) -> None:
    """SIGCONT what ``freeze_agent`` stopped, so the job can end normally."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def agent_environ(public_id: str, name: str) -> str:
    """A variable of the worker's agent's environment ("" if no agent or no such variable)."""
    wanted = name.encode()
    for pid in agent_pids(public_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            key, _, value = entry.partition(b"=")
            if key == wanted:
                return value.decode()
    return ""


@dataclass(frozen=True)
class SignedAgent:
    """Sends agent calls as a job's agent does: each signed with the worker's key."""

    public_id: str
    key_id: str
    key: str

    def signed(
        self, path: str, body: bytes, *, method: str = "POST", ts: int | str | None = None
    ) -> tuple[str, str]:
        """An Authorization header for this request, and its nonce. Its time is ``ts`` (whole
        seconds, or "seconds.micros"), or now to the microsecond as the agent stamps it: the
        platform refuses a request older than one it accepted from the same key."""
        nonce = activate_agent.new_nonce()
        if ts is None:
            seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
            ts = f"{seconds}.{micros:06d}"
        when = str(ts)
        header = activate_agent.authorization(
            self.public_id, self.key_id, self.key, method, path, body, when, nonce
        )
        return header, nonce

    def post(
        self, client: httpx.Client, path: str, payload: dict[str, object] | None = None
    ) -> AgentAnswer:
        """POST ``path`` (e.g. /agent/v1/heartbeat) signed, and whether its answer is signed."""
        body = json.dumps(payload if payload is not None else {"worker": self.public_id}).encode()
        header, nonce = self.signed(path, body)
        headers = {"Authorization": header, "Content-Type": "application/json"}
        response = client.post(path, content=body, headers=headers)
        signed = activate_agent.verified(
            self.key,
            response.status_code,
            nonce,
            response.content,
            response.headers.get(activate_agent.SIGNATURE_HEADER, ""),
        )
        return AgentAnswer(response, signed)


@dataclass(frozen=True)
class AgentAnswer:
    response: httpx.Response
    signed: bool  # carries the platform's valid signature for this request

    @property
    def status_code(self) -> int:
        return self.response.status_code


def signed_agent(public_id: str) -> SignedAgent | None:
    """The worker's agent's credentials, read from its environment (None if no agent)."""
    key_id = agent_environ(public_id, "ACTIVATE_AGENT_KEY_ID")
    key = agent_environ(public_id, "ACTIVATE_AGENT_KEY")
    return SignedAgent(public_id, key_id, key) if key_id and key else None


def agent_url(public_id: str) -> str:
    """The platform URL the worker's agent calls back on."""
    return agent_environ(public_id, "ACTIVATE_URL").rstrip("/")


# -- a crowd of simulated agents -------------------------------------------------------------


@dataclass(frozen=True)
class CrowdMember:
    worker_id: int
    public_id: str
    key_id: str
    key: str


def crowd_workers(count: int, *, beside: Worker, name: str = "crowd") -> list[CrowdMember]:
    """``count`` workers as a submission leaves them once their job runs (starting, a key of
    their own, the events saying so), made in bulk, their agents' credentials returned. They
    share the job and node of ``beside``, a real worker's running job: the scheduler's polls see
    it running and leave them be, as they would a job of their own."""
    from django.conf import settings
    from django.utils import timezone

    from core.env import TEST_SECRET_KEY
    from workers_app.agent_keys import issue_agent_key
    from workers_app.models import Worker, WorkerEvent
    from workers_app.statuses import WorkerStatus

    now = timezone.now()
    rows, keys = [], []
    for i in range(count):
        worker = Worker(
            name=f"{name}-{i}",
            owner=beside.owner,
            cluster=beside.cluster,
            environment=beside.environment,
            account=beside.account,
            status=WorkerStatus.STARTING,
            scheduler_job_id=beside.scheduler_job_id,
            node_hostname=beside.node_hostname,
            created_at=now,
            submitted_at=now,
            started_at=now,
            deadline_at=now + timedelta(seconds=settings.ACTIVATE_PENDING_TIMEOUT),
        )
        # The platform's processes run the test settings, whose key derives the agents' keys.
        key = issue_agent_key(worker.public_id, secret_key=TEST_SECRET_KEY)
        worker.agent_secret_hash = key.key_hash
        rows.append(worker)
        keys.append(key)
    Worker.objects.bulk_create(rows)
    pks = dict(
        Worker.objects.filter(public_id__in=[w.public_id for w in rows]).values_list(
            "public_id", "pk"
        )
    )
    steps = (
        (WorkerStatus.PENDING, WorkerStatus.QUEUED),
        (WorkerStatus.QUEUED, WorkerStatus.STARTING),
    )
    WorkerEvent.objects.bulk_create(
        WorkerEvent(worker_id=pks[w.public_id], old_status=old, new_status=new, at=now)
        for w in rows
        for old, new in steps
    )
    return [
        CrowdMember(pks[w.public_id], w.public_id, key.key_id, key.key)
        for w, key in zip(rows, keys, strict=True)
    ]


@dataclass(frozen=True)
class AgentCall:
    """One call an agent of the crowd made: seconds since the epoch it was sent and answered,
    and how it ended ("ok", the refusal's status, or the exception's name)."""

    member: CrowdMember
    path: str
    sent: float
    answered: float
    outcome: str

    @property
    def accepted(self) -> bool:
        return self.outcome == "ok"


class AgentCrowd:
    """The crowd's agents in one process of their own (harness/agent_crowd.py), connecting
    (``connecting`` at a time) and beating as the real agent does until ``stop``. ``calls``
    reads what they did so far."""

    def __init__(
        self, members: list[CrowdMember], *, url: str, interval: float, job_id: str,
        hostname: str, workdir: Path, connecting: int = 8,
    ) -> None:  # fmt: skip
        self.members = members
        self.spec = workdir / "crowd.json"
        self.out = workdir / "crowd-calls.txt"
        self.log = workdir / "crowd.log"
        self.url, self.interval, self.job_id, self.hostname = url, interval, job_id, hostname
        self.connecting = connecting
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        agents = [[m.public_id, m.key_id, m.key, self.job_id, self.hostname] for m in self.members]
        spec = {"url": self.url, "interval": self.interval, "connecting": self.connecting}
        self.spec.write_text(json.dumps({**spec, "agents": agents}))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "harness.agent_crowd", str(self.spec), str(self.out)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> AgentCrowd:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def calls(self) -> list[AgentCall]:
        if not self.out.exists():
            return []
        found = []
        for line in self.out.read_text().splitlines():
            fields = line.split(" ")
            if len(fields) == 5:  # a line being written is left for the next read
                index, path, sent, answered, outcome = fields
                found.append(
                    AgentCall(self.members[int(index)], path, float(sent), float(answered), outcome)
                )
        return found

"""The agents the platform's jobs start on the node (this machine), found by their environment.

Freezing one (SIGSTOP) is a node that "disappears": the agent stops answering while its job keeps
the allocation.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

from node import activate_agent


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

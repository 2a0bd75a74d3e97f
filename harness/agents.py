"""The agents the platform's jobs start on the node (this machine), found by their environment.

Freezing one (SIGSTOP) is a node that "disappears": the agent stops answering while its job keeps
the allocation.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path


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


def agent_secret(public_id: str) -> str:
    """The secret the worker's agent beats with."""
    return agent_environ(public_id, "ACTIVATE_WORKER_SECRET")


def agent_url(public_id: str) -> str:
    """The platform URL the worker's agent calls back on."""
    return agent_environ(public_id, "ACTIVATE_URL").rstrip("/")

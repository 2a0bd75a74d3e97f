from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import SshTarget


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
    """The node "disappears": its agent stops answering while the job keeps its allocation."""
    pids = agent_pids(public_id)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def squeue_names(target: SshTarget) -> list[str]:
    result = subprocess.run(
        ["squeue", "-h", "-u", target.user, "-o", "%j"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.split()

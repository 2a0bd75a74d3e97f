"""The relays the platform starts on the test cluster's login host (this machine), found by their
command line, and the sshd session each runs under: what a test kills to break one."""

from __future__ import annotations

from pathlib import Path


def _words(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def relay_pids(tag: str) -> list[int]:
    """Relay processes of one cluster and installation (``relays.relay_tag``)."""
    return [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit()
        and b"activate-relay" in (words := _words(int(proc.name)))
        and tag.encode() in words
    ]


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command may hold spaces and parentheses: fields resume after the last ")".
    return int(stat.rpartition(")")[2].split()[1])


def sshd_session_of(pid: int) -> int:
    """The nearest sshd ancestor of ``pid``: the session process of its SSH connection (0 if
    none). Killed, the connection drops as a network failure would drop it."""
    current = parent_of(pid)
    while current > 1:
        name = Path(f"/proc/{current}/comm").read_text().strip() if _words(current) else ""
        if name.startswith("sshd"):
            return current
        current = parent_of(current)
    return 0

"""This machine's processes as /proc shows them: the test cluster's node is this machine, so a
session's programs can be watched from the test."""

from __future__ import annotations

from pathlib import Path


def args_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _stat(pid: int) -> list[str]:
    # The command's name is in parentheses and may hold spaces: the fields follow its last ")".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its programs and theirs)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(_stat(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def identities(pids: list[int]) -> set[tuple[int, int]]:
    """Each live process as (pid, start time): a pid reused later is another process."""
    known = set()
    for pid in pids:
        try:
            stat = _stat(pid)
        except (OSError, IndexError):
            continue
        if stat[0] != "Z":
            known.add((pid, int(stat[19])))
    return known


def still_running(known: set[tuple[int, int]]) -> list[str]:
    """Those of ``known`` that still run, by command line."""
    return [" ".join(args_of(pid))[:120] for pid, _ in known & identities([p for p, _ in known])]

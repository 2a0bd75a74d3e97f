"""Beat on two "hosts": one sends, and when it is SIGKILLed the other takes over within a lease.

Two beat processes run side by side with the beat lease (core/beat.py; 5 s here, sweeps
every second) while workers are queued and connected. Each round SIGKILLs the beat holding the
lease and times, from the kill, the other's first sweep sent (by its log's "Sending due task"
lines); the killed one is started again and stands by. Every sweep sent is counted per beat:
a sweep entry sent by both beats less than one sweep interval apart is an overlap (none may
occur), and no status may change across the failovers.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path

from drills.drill import Drill, DrillResult, now, pause
from harness import HarnessError
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for, wait_until

NAME = "Beat on two hosts, the holder SIGKILLed"
LEASE = 5.0
KNOBS = {"ACTIVATE_BEAT_LEASE": f"{LEASE:g}"}
BEATS = ("beat-a", "beat-b")
SENT = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/\w+\] "
    r"Scheduler: Sending due task (sweep-[\w-]+) ",
    re.MULTILINE,
)


def run(target: SshTarget, *, rounds: int = 3) -> DrillResult:
    from core.beat import lease_key

    with Drill("beat-failover", target, title=NAME, knobs=KNOBS) as drill:
        platform = drill.platform
        platform.start_web()
        platform.start_agents()
        platform.start_worker()
        platform.start_sweeper()
        for name in BEATS:
            platform.start_beat(name)
        held, running = drill.settled(queued=1, connected=2)
        began = now()
        sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
        client = platform.redis_client()
        took: list[float] = []
        for _ in range(rounds):
            try:
                holder = wait_for(
                    lambda: _holder(platform.processes, client.get(lease_key())) or "",
                    timeout=2 * LEASE,
                )
            except TimeoutError:
                raise HarnessError(
                    f"no beat holds the lease: {client.get(lease_key())!r}, "
                    f"{ {n: p.pid for n, p in platform.processes.items()} }"
                ) from None
            other = next(name for name in BEATS if name != holder)
            seconds = _fail_over(platform, holder, platform.workdir / f"{other}.log")
            if seconds is None:
                drill.check(False, f"{other} sent no sweep within {3 * LEASE:g} s of the kill")
                break
            took.append(seconds)
            platform.start_beat(holder)
            pause(3 * sweep)
        sends = {name: sweeps_sent(platform.workdir / f"{name}.log") for name in BEATS}
        overlaps = sweep_overlaps(sends, sweep)
        drill.result.repetitions = len(took)
        limit = LEASE
        drill.check(
            all(t < limit for t in took),
            f"takeovers took {', '.join(f'{t:.1f}' for t in took)} s; limit {limit:g} s",
        )
        drill.check(not overlaps, f"sweeps sent by both beats in one interval: {overlaps[:5]}")
        changes = drill.changes_since(began, held + running)
        drill.check(not changes, f"status changed across a failover: {changes}")
        drill.note(
            f"lease {LEASE:g} s, sweeps every {sweep:g} s; holder SIGKILLed {len(took)} times, "
            f"the other's first sweep after {', '.join(f'{t:.1f}' for t in took)} s "
            f"(limit: one lease, {limit:g} s); sweeps sent: "
            + ", ".join(f"{name} {len(s)}" for name, s in sends.items())
            + f"; overlaps {len(overlaps)}; no status change"
        )
        return drill.result


def _fail_over(platform: Platform, holder: str, other_log: Path) -> float | None:
    """SIGKILL the holder: seconds until the other beat sent its first sweep (None: not soon)."""
    killed_at = datetime.now().timestamp()
    platform.kill(holder)
    if not wait_until(lambda: sweeps_sent(other_log, after=killed_at), timeout=3 * LEASE):
        return None
    return sweeps_sent(other_log, after=killed_at)[0][0] - killed_at


def _holder(processes: dict[str, subprocess.Popen[bytes]], token: object) -> str | None:
    """Which beat the lease's token names (it holds the beat process's pid)."""
    if not isinstance(token, bytes):
        return None
    pid = int(token.decode().split(":")[1])
    for name in BEATS:
        process = processes.get(name)
        if process is not None and process.pid == pid:
            return name
    return None


def sweeps_sent(log: Path, *, after: float = 0.0) -> list[tuple[float, str]]:
    """(time, entry) of each sweep a beat's log says it sent, after ``after``."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    found = [
        (datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2))
        for m in SENT.finditer(text)
    ]
    return [(at, entry) for at, entry in found if at > after]


def sweep_overlaps(sends: dict[str, list[tuple[float, str]]], sweep: float) -> list[str]:
    """Sweep entries sent by different beats less than one interval apart."""
    merged = sorted((at, entry, name) for name, found in sends.items() for at, entry in found)
    last: dict[str, tuple[float, str]] = {}
    overlaps = []
    for at, entry, name in merged:
        before = last.get(entry)
        if before is not None and before[1] != name and at - before[0] < sweep:
            overlaps.append(f"{entry} by {before[1]} and {name} {at - before[0]:.2f} s apart")
        last[entry] = (at, name)
    return overlaps
